"""Custom ops of gdn-trt: the gated delta rule and the causal conv with state, one folder each.

Importing this package registers the torch operators (`torch.ops.gdn_trt.*`)."""

from .causal_conv1d import op as _conv_op  # noqa: F401  (registers the conv ops)
from .gated_delta_rule import op as _gdn_op  # noqa: F401  (registers the GDN ops)
