# Mutation check for the loader tests: applies each deliberate bug, runs the test binary that must
# catch it, prints RED/green, and restores the file. Run from the repository root: python3 tools/loader_mutants.py
import subprocess, sys
muts = [
 ("A swapped nibbles", "nemotron-formats/src/lib.rs", "out[c] = e2m1_to_f32(byte & 0x0F) * bs * weight_scale_2;\n            out[c + 1] = e2m1_to_f32(byte >> 4) * bs * weight_scale_2;", "out[c] = e2m1_to_f32(byte >> 4) * bs * weight_scale_2;\n            out[c + 1] = e2m1_to_f32(byte & 0x0F) * bs * weight_scale_2;", "formats_modelopt"),
 ("B ignored weight_scale_2", "nemotron-formats/src/lib.rs", "out[c] = e2m1_to_f32(byte & 0x0F) * bs * weight_scale_2;", "out[c] = e2m1_to_f32(byte & 0x0F) * bs;", "formats_modelopt"),
 ("C e2m1 tie 0.75 rounds down", "nemotron-formats/src/lib.rs", "} else if a < 0.75 {", "} else if a <= 0.75 {", "formats_modelopt"),
 ("D no unexpected-tensor check", "nemotron-loader/src/load.rs", "            if plan.get(&e.name).is_none() {\n                return Err(", "            if false && plan.get(&e.name).is_none() {\n                return Err(", "malformed"),
 ("E no scale value check", "nemotron-loader/src/load.rs", "if !(v.is_finite() && v > 0.0) {", "if false {", "malformed"),
 ("F no block-scale NaN check", "nemotron-loader/src/load.rs", "if let Some(i) = src.iter().position(|&b| formats::e4m3_is_nan(b) || (b & 0x80 != 0 && b != 0x80)) {", "if let Some(i) = None::<usize> {", "malformed"),
 ("G eps defaulted", "nemotron-loader/src/config.rs", """            .transpose()?
            .ok_or_else(|| {""", """            .transpose()?
            .or(Some((1e-5, "default")))
            .ok_or_else(|| {""", "malformed"),
 ("H KV scales not planned", "nemotron-loader/src/plan.rs", "if self.recipe.kv_cache_fp8 {", "if false {", "structure"),
 ("I index not cross-checked", "nemotron-loader/src/shards.rs", "        if let Some(map) = weight_map {", "        if let Some(map) = weight_map.filter(|_| false) {", "malformed"),
]
for name, path, old, new, test in muts:
    s = open(path).read()
    assert old in s, name
    open(path, "w").write(s.replace(old, new, 1))
    # The loader's tests are modules of one binary (tests/it): run the named module.
    r = subprocess.run(["cargo", "test", "--release", "-p", "nemotron-loader", "--test", "it", "--", f"{test}::"], capture_output=True, text=True)
    failed = [l.split()[1] for l in r.stdout.splitlines() if l.startswith("test ") and l.endswith("FAILED")]
    print(f"{name}: {'RED' if r.returncode else 'green?!'} ({len(failed)} failed: {', '.join(failed)})", flush=True)
    open(path, "w").write(s)
