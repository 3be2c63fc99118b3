"""Small helpers shared by the benchmark scripts."""
import platform
import subprocess


def cpu_model():
    """The CPU's model name, as /proc/cpuinfo gives it."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def gpu_model():
    """The first GPU's name and driver, as nvidia-smi gives them."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
        if out:
            name, driver = (x.strip() for x in out[0].split(",", 1))
            return f"{name} (driver {driver})"
    except (OSError, ValueError, subprocess.TimeoutExpired):
        pass
    return "unknown GPU"
