"""The benchmarks of substreams (`substreams bench`), beside the library and not in it.

Installed with the ``bench`` extra (``pip install 'substreams[bench]'``), which brings their
plotting dependency; the ``substreams`` package never imports this one.
"""
