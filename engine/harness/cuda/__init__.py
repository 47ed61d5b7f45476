"""The CUDA backend of the judge: build a candidate with NVRTC, run it on the GPU in a sandboxed child, judge it.

Where to look:

- how a candidate is built: ``compile.py`` (NVRTC to a content-addressed artifact, ``load_cuda_artifact``),
  ``nvrtc.py`` with ``nvrtc_child.py`` (NVRTC in a confined child process), ``launch.py`` (the grid, block and
  shared memory of a launch, per shape, and its check), ``arch.py`` (which architecture a target names, and
  its limits) and ``ptxas.py`` (ptxas's resource report: registers, spills, shared memory);
- where it runs: ``worker.py`` (the sandboxed child that owns the CUDA context), ``device.py`` (the driver
  calls it makes), ``layout.py`` (guarded regions and output poison in device memory), ``arguments.py`` (the
  parameter block of ``cuLaunchKernel``), ``messages.py`` (what the parent and the child say to each other)
  and ``child.py`` (the parent's side of the child, its watchdog, the verdict of a child that died);
- how it is timed: ``timing.py`` (CUDA events, the L2 flush, rotating inputs, interleaved rounds),
  ``inputs.py`` (the benchmark's input sets, kept between benchmarks), ``bandwidth.py`` (the measured HBM
  bandwidth, the roofline's denominator), ``fingerprint.py`` (which GPU) and ``lease.py`` (one timed job per
  GPU);
- the judge's entry points: ``judge.py`` (``validate_cuda``, ``benchmark_cuda``).

Kept free of imports: the sandboxed child imports modules of this package, and the CUDA judge runs on GPU
machines with only numpy, pydantic, psutil and cuda-python installed.
"""
