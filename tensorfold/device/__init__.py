"""The device's mechanics below the kernels: launching a kernel with little host work, recording and replaying
CUDA graphs, the caching device-memory pool, and the launch grid. Under numba's CUDA simulator
(`NUMBA_ENABLE_CUDASIM=1`, read once when numba.cuda is first imported) the same code runs on the CPU, its blocks
scheduled by simulator.py."""
import os

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
if SIMULATED:
    from tensorfold.device import simulator
    simulator.install()  # before any kernel runs, whichever module first imports the device
