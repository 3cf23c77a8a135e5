"""tools/sass_counts.py's reading of SASS: the loop it reports is the basic block with the most multiply-adds (FFMA
and IMMA), each instruction counted by its opcode, whatever its predicate or modifiers. (The tool itself needs
NVIDIA's ptxas and nvdisasm wheels, which the test extra does not install.)"""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "sass_counts.py"

SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   FFMA R7, R1, R1, RZ ;
.L_x_1:
        /*0020*/                   LDG.E.64 R2, desc[UR4][R4.64+0x100] ;
        /*0030*/              @P0  FFMA R3, R2, R2, R3 ;
        /*0040*/                   FFMA R3, R2, R2, R3 ;
        /*0050*/                   I2FP.F32.U32 R6, R6 ;
        /*0060*/             @!P1  BRA `(.L_x_1) ;
.L_x_2:
        /*0070*/                   FFMA R5, R3, R3, R5 ;
        /*0080*/                   EXIT ;
"""


def test_busiest_block_is_the_loop_with_the_most_ffma():
    spec = importlib.util.spec_from_file_location("sass_counts", SCRIPT)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    loop = tool.busiest_block(SASS)
    assert loop == {"FFMA": 2, "LDG": 1, "I2FP": 1, "BRA": 1}
    # control: with its labels hidden the kernel is one block, and the same reading counts every FFMA in it
    assert tool.busiest_block(SASS.replace(".L_x_", "x_"))["FFMA"] == 4


def test_blocks_a_multiprocessor_from_registers_threads_and_shared_memory():
    spec = importlib.util.spec_from_file_location("sass_counts", SCRIPT)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    blocks = tool.blocks_a_multiprocessor
    # the GEMM kernels' blocks of 4 warps: a warp's registers come in units of 256 (8 a thread)
    assert [blocks(r, 128) for r in (106, 128, 168, 246)] == [4, 4, 3, 2]
    assert blocks(174, 128) == 2  # six registers past 168 cost a block (what the wide round kernel once did)
    assert blocks(32, 1024) == 2 and blocks(16, 32) == 32  # the threads bound, the blocks bound
    assert blocks(106, 128, 100 << 10) == 2  # the shared memory bound
