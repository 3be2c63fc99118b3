"""Small helpers shared by the benchmark scripts."""
import platform


def cpu_model():
    """The CPU's model name, as /proc/cpuinfo gives it."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
