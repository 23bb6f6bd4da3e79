# Sourced by the GPU measurement scripts beside it: the output folder $O, the build unpacked to
# /tmp/lockstep (from ${G:-.gpu}), the card named in $O/gpu.txt, `fields` (the metrics.jsonl
# fields a row quotes, for grep -o) and `poll FILE` (nvidia-smi's memory.used every 0.2 s into
# FILE in the background; prints its pid).
O="${O:-${OUT:-.gpu/out}}"
mkdir -p "$O"
[ -x /tmp/lockstep ] || { gunzip -c ${G:-.gpu}/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader | tee -a "$O/gpu.txt"
fields='"step":[0-9]*\|"bit_equal_frac":[0-9.e-]*\|"kl_k1":[0-9.e-]*\|"trainer_weights_fingerprint":"[0-9a-f]*"\|"step_s":[0-9.]*\|"gen_s":[0-9.]*\|"update_s":[0-9.]*\|"gen_preempted":[0-9]*'
poll() { ( while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.2; done ) > "$1" 2>/dev/null & echo $!; }
