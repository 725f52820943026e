# Mutation check for the model tests: applies each deliberate bug, runs the test binary that must
# catch it, prints RED/green, and restores the file. Run from the repository root:
#   python3 tools/model_mutants.py
import subprocess
muts = [
 ("conv state keeps the oldest inputs", "nemotron-kernels/src/reference.rs",
  "let j = len as isize - km1 as isize + s as isize;", "let j = s as isize - km1 as isize;", "consistency"),
 ("scan runs every sequence for the first one's length", "nemotron-kernels/src/reference.rs",
  "for t in 0..lens[b] {", "for t in 0..lens[0].min(t_max) {", "consistency"),
 ("SSM decay without dt", "nemotron-kernels/src/reference.rs",
  "let decay = (dtv * a[hh]).exp();", "let decay = a[hh].exp();", "hf_parity"),
 ("routing weights not renormalized", "nemotron-model/src/moe.rs",
  "if c.norm_topk_prob {", "if false && c.norm_topk_prob {", "hf_parity"),
  ("top-k keeps one too many", "nemotron-model/src/generate.rs",
  "idx.truncate(s.top_k);", "idx.truncate(s.top_k + 1);", "generation"),
 ("top-p drops the token that crosses p", "nemotron-model/src/generate.rs",
  ".map_or(p.len(), |k| k + 1);", ".map_or(p.len(), |k| k.max(1));", "generation"),
 ("stop ids ignored", "nemotron-model/src/generate.rs",
  "if self.opts.stop_ids.contains(&tok) {", "if false && self.opts.stop_ids.contains(&tok) {", "generation"),
 ("stream releases incomplete characters", "src/text.rs",
  "&& !text.ends_with('\\u{FFFD}')", "", "generation"),
 ("batch ignores per-sequence seeds", "nemotron-model/src/generate.rs",
  "o.sampling.seed = opts.sampling.seed.wrapping_add(i as u64);", "o.sampling.seed = opts.sampling.seed;", "generation"),
]
for name, path, old, new, test in muts:
    s = open(path).read()
    assert old in s, name
    open(path, "w").write(s.replace(old, new, 1))
    r = subprocess.run(["cargo", "test", "--release", "--test", test], capture_output=True, text=True)
    failed = [l.split()[1] for l in r.stdout.splitlines() if l.startswith("test ") and l.endswith("FAILED")]
    print(f"{name}: {'RED' if r.returncode else 'green?!'} ({len(failed)} failed: {', '.join(failed)})", flush=True)
    open(path, "w").write(s)
