"""The gdn-trt application on top of the library: the `gdn-trt` command line (`cli`), the `make run` job (`main`)
and its checked continuous-batching scenario (`scenario`), and the import-graph check (`imports`)."""
