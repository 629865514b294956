import glob, json, sys
from tensorforge.runtime.engine import Engine
for path in sorted(glob.glob(sys.argv[1] + "/*.engine")):
    if "fp16" in path:
        continue
    report = Engine.load(path).report
    chain = report.get("quantized_activations") or {}
    print(path, {k: v for k, v in chain.items() if k not in ("float", "chained")}, "chained", len(chain.get("chained", [])))
    print("  float_blocks", json.dumps((report.get("quantization") or {}).get("float_blocks")))
