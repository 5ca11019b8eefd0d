"""What the node did while a stage ran: nvidia-smi's clocks and power state sampled every 250 ms, and
the container's CPU quota and throttling before and after (issue 49: whole turns ran at 60-80 ms a
step instead of 20, AR's too; these tell a clock drop or a throttled CPU from a method's own cost)."""

from __future__ import annotations

import shutil
import statistics
import subprocess
from pathlib import Path


def cgroup_cpu() -> dict:
    """The container's CPU quota and throttling so far (cgroup v2, else v1; {} where neither is readable):
    a launch-bound decode on a node whose quota is below its visible cores is throttled in bursts."""
    out = {}
    for v2, v1, key in (("/sys/fs/cgroup/cpu.max", None, "cpu_max"),
                        ("/sys/fs/cgroup/cpu.stat", "/sys/fs/cgroup/cpu/cpu.stat", "cpu_stat")):
        for path in (v2, v1):
            if path and Path(path).is_file():
                out[key] = Path(path).read_text().strip()
                break
    if "cpu_max" not in out and Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").is_file():
        out["cpu_max"] = (Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text().strip() + " "
                          + Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text().strip())
    if "cpu_stat" in out:  # "nr_throttled 3\nthrottled_usec 12" (v2) or "throttled_time" in ns (v1)
        stat = dict(line.split() for line in out["cpu_stat"].splitlines() if len(line.split()) == 2)
        out["nr_throttled"] = int(stat.get("nr_throttled", 0))
        out["throttled_ms"] = (int(stat["throttled_usec"]) / 1e3 if "throttled_usec" in stat
                               else int(stat.get("throttled_time", 0)) / 1e6)
    return out


class NodeSampler:
    """While a real-model stage runs on a GPU: nvidia-smi's SM clock, power state, use and power every
    250 ms into `<stage>_gpu_samples.csv`, and the container's CPU throttling before and after."""

    QUERY = "timestamp,clocks.sm,clocks.mem,pstate,utilization.gpu,power.draw,temperature.gpu"

    def __init__(self, work: Path, name: str):
        self.path, self.proc, self.before = work / f"{name}_gpu_samples.csv", None, cgroup_cpu()
        if shutil.which("nvidia-smi"):
            self.file = self.path.open("w")
            self.proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={self.QUERY}", "--format=csv,nounits",
                                          "-lms", "250"], stdout=self.file, stderr=subprocess.DEVNULL)

    def stop(self) -> dict:
        """What the samples say: SM clock min / median / max (MHz), power states seen, throttling."""
        out = {}
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=5)
            self.file.close()
            rows = [r.split(", ") for r in self.path.read_text().splitlines()[1:] if r.count(",") >= 6]
            clocks = [float(r[1]) for r in rows if r[1].strip().replace(".", "").isdigit()]
            if clocks:
                out.update(samples=len(rows), sm_mhz_min=min(clocks), sm_mhz_median=statistics.median(clocks),
                           sm_mhz_max=max(clocks), pstates=sorted({r[3].strip() for r in rows}))
        after = cgroup_cpu()
        out["cpu_max"] = after.get("cpu_max")
        if "nr_throttled" in after and "nr_throttled" in self.before:
            out["cpu_throttled_periods"] = after["nr_throttled"] - self.before["nr_throttled"]
            out["cpu_throttled_ms"] = round(after["throttled_ms"] - self.before["throttled_ms"], 1)
        return out
