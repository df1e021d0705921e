"""gdn-trt export."""
