"""Links cuBLAS and NCCL into DEST under the names cudarc loads (libcublas.so, libnccl.so), from PyTorch's pip
packages (nvidia/*/lib) or the usual system folders; prints what it found. Used by scripts/gpu-check.sh."""
import glob
import os
import sys

dest = sys.argv[1]
roots = []
try:
    import nvidia  # the namespace package of NVIDIA's pip wheels

    roots += list(nvidia.__path__)
except ImportError:
    pass
roots += ["/usr/local/cuda/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/local/nvidia/lib64"]
for name in ["libcublas", "libcublasLt", "libnccl"]:
    link = os.path.join(dest, name + ".so")
    if os.path.exists(link):
        continue
    found = []
    for root in roots:
        found = sorted(glob.glob(os.path.join(root, "**", name + ".so*"), recursive=True))
        if found:
            break
    if found:
        os.symlink(found[-1], link)
        print(f"{name}: {found[-1]}")
    else:
        print(f"{name}: not found (the checks that need it will say so)")
