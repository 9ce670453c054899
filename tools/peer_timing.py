"""The PyTorch peers' timing loop, shared by the bench scripts: median CUDA-event milliseconds of a call."""
import torch


def median_ms(fn, iters, warmup=3):
    """Median milliseconds of fn() over `iters` calls timed with CUDA events, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]
