"""EXPERIMENT: the GDN decode kernel at N = 64 (default tuning) inside cudaProfilerStart/Stop, for ncu's source view."""
import torch
from cases import HV, K, V, gdn_inputs, packing

from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri

N = 64
x, pack = gdn_inputs(N, 1), packing([1] * N)
pools = [torch.randn(N, HV, K, V, device="cuda") * 0.5 for _ in range(4)]
for i in range(4):
    gdn_tri.launch_recurrent(x, pack, pools[i], None, gdn_tri.TUNING)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
gdn_tri.launch_recurrent(x, pack, pools[1], None, gdn_tri.TUNING)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
