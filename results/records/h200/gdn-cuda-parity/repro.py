import faulthandler, os, sys
faulthandler.enable()
import torch
print("torch", torch.__version__, flush=True)
import gdn_cuda
print("gdn_cuda", gdn_cuda.__file__, [a for a in dir(gdn_cuda) if not a.startswith("_")], flush=True)
root = os.environ["GDN_CUDA_ROOT"]; home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
print("init", root, home, flush=True)
gdn_cuda.init(library_root=root, cuda_home=home)
print("init done", flush=True)
torch.manual_seed(0)
B, T, H, D = 1, 128, 1, 64
dev = "cuda"
q = torch.randn(B, T, H, D, device=dev, dtype=torch.bfloat16)
k = torch.nn.functional.normalize(torch.randn(B, T, H, D, device=dev), dim=-1).bfloat16()
v = torch.randn(B, T, H, D, device=dev, dtype=torch.bfloat16)
beta = torch.rand(B, T, H, device=dev).bfloat16()
g = -torch.rand(B, T, H, device=dev, dtype=torch.float32) * 0.1
which = sys.argv[1] if len(sys.argv) > 1 else "chunk"
print("calling", which, flush=True)
if which == "chunk":
    o, s = gdn_cuda.chunked_forward(query=q, key=k, value=v, beta=beta, gate=g, scale=D ** -0.5)
else:
    o, s = gdn_cuda.recurrent_forward(query=q, key=k, value=v, beta=beta, gate=g, scale=D ** -0.5)
torch.cuda.synchronize()
print("ok", o.shape, s.shape, o.float().abs().mean().item(), flush=True)
