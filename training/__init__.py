"""Training: SB3 policies, recorded traces, Ray sweeps, export to ONNX."""
