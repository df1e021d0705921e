"""gdn-trt runtime/ple."""
