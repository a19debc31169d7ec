"""dev/profile_decode.py --summarise reads Nsight Compute's CSV (ncu --csv --metrics gpu__time_duration.sum): the
tool's own lines before the header, units per row, thousands separators. String work only: no GPU."""
from tests.dev import load_dev_script

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def row(i, kernel, unit, value):
    return (f'"{i}","1","python3","h","{kernel}","1","13","(128, 1, 1)","(4096, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","gpu__time_duration.sum","{unit}","{value}"')


def test_summarise_sums_each_kernel_in_microseconds(tmp_path, capsys):
    csv = tmp_path / "ncu.csv"
    csv.write_text("\n".join([
        "==PROF== Connected to process 1 (/usr/bin/python3)", "==PROF== Disconnected from process 1", HEADER,
        row(0, "void rope_qkv<__nv_bfloat16>(const T1 *, int)", "ns", "24,680"),
        row(1, "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_TNT", "us", "110.5"),
        row(2, "void rope_qkv<__nv_bfloat16>(const T1 *, int)", "usecond", "25.32"),
    ]) + "\n")
    load_dev_script("profile_decode").summarise(str(csv))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "3 kernels, 160.5 us of kernel time"
    # largest total first; the argument list is cut from the name
    assert lines[1].split()[0].startswith("nvjet_sm90") and lines[1].split()[-5:-3] == ["110.5", "us"]
    assert lines[2].split()[:2] == ["void", "rope_qkv<__nv_bfloat16>"]
    assert "x   2" in lines[2] and "50.0 us" in lines[2] and "25.00 us each" in lines[2]
