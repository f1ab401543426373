"""``jcmd GC.heap_info`` parsed for every collector the server may run with (no JVM needed)."""

from freshidx.spark_server.jvm import heap_used_bytes

G1 = """ garbage-first heap   total 262144K, used 81234K [0x00000000c0000000, 0x0000000100000000)
  region size 1024K, 52 young (53248K), 6 survivors (6144K)
 Metaspace       used 61234K, committed 61952K, reserved 1114112K
  class space    used 7890K, committed 8192K, reserved 1048576K
"""
SERIAL = """ def new generation   total 78656K, used 12000K [0x00000000c0000000, 0x00000000c5550000, 0x00000000d5550000)
  eden space 69952K,  17% used [0x00000000c0000000, 0x00000000c0bb8000, 0x00000000c4450000)
  from space 8704K,   0% used [0x00000000c4450000, 0x00000000c4450000, 0x00000000c4cd0000)
 tenured generation   total 174784K, used 50000K [0x00000000d5550000, 0x00000000e0000000, 0x0000000100000000)
 Metaspace       used 61234K, committed 61952K, reserved 1114112K
"""
PARALLEL = """ PSYoungGen      total 76288K, used 3000K [0x00000000eab00000, 0x00000000f0000000, 0x0000000100000000)
 ParOldGen       total 175104K, used 7000K [0x00000000c0000000, 0x00000000cab00000, 0x00000000eab00000)
 Metaspace       used 3000K, committed 3200K, reserved 1056768K
"""
ZGC = """ ZHeap           used 120M, capacity 256M, max capacity 1024M
 Metaspace       used 61234K, committed 61952K, reserved 1114112K
"""


def test_heap_used_is_every_generation_and_never_metaspace() -> None:
    assert heap_used_bytes(G1) == 81234 * 1024
    assert heap_used_bytes(SERIAL) == (12000 + 50000) * 1024  # young + old, not the young generation alone
    assert heap_used_bytes(PARALLEL) == (3000 + 7000) * 1024
    assert heap_used_bytes(ZGC) is None  # an unknown format: the caller falls back to RSS
    assert heap_used_bytes("") is None
