"""substreams."""
