"""EXPERIMENT: the chunked prefill's passes at T = 4096 (default tuning) inside cudaProfilerStart/Stop, for ncu's
source view of the state pass."""
import torch
from cases import HV, K, V, gdn_inputs, packing

from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri
from gdn_trt.plugins.packing import Capture

x, pack = gdn_inputs(4096, 2), packing((4096,))
pool = torch.randn(1, HV, K, V, device="cuda") * 0.5
cap = Capture(torch.full((1,), -1, dtype=torch.int32, device="cuda"), torch.empty_like(pool))
for _ in range(2):
    gdn_tri.launch_chunked(x, pack, pool, cap, gdn_tri.TUNING)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
gdn_tri.launch_chunked(x, pack, pool, cap, gdn_tri.TUNING)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
