"""gdn-trt runtime."""
