"""The live dashboard (`substreams ui`): a model following the control topics, a page, and
an HTTP server with server-sent events and stream tails."""
