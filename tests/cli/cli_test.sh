#!/usr/bin/env bash
# The `strata` command as a user meets it: bad input, faults and interrupts end with one clear line and a
# meaningful exit status, never `terminate called`. Usage: cli_test.sh STRATA_BINARY
set -uo pipefail
strata=$1
work=$(mktemp -d /tmp/strata-cli-XXXXXX)
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# run NAME EXPECTED_RC PATTERN [ARGS...]: runs strata, checks the exit status and that the output holds PATTERN
# (an extended regex) and no "terminate called". The output stays in $last.
last=
run() {
  local name=$1 want=$2 pattern=$3
  shift 3
  local out rc
  out=$("$strata" "$@" 2>&1)
  rc=$?
  last=$out
  [ "$rc" -eq "$want" ] || fail "$name: exit status $rc, expected $want; output: $(echo "$out" | tail -3)"
  grep -Eq -- "$pattern" <<<"$out" || fail "$name: output lacks /$pattern/: $(echo "$out" | tail -3)"
  if grep -q "terminate called" <<<"$out"; then fail "$name: terminate called"; fi
  echo "ok: $name"
}

for i in $(seq 1 300); do echo "the quick brown fox jumps over the lazy dog $((i % 7))"; done >"$work/corpus.txt"
tiny=(--set "data.path=$work/corpus.txt" --set train.device=cpu --set model.num_layers=1 --set model.hidden_size=32
  --set model.num_attention_heads=2 --set model.seq_length=32 --set train.micro_batch_size=4 --set train.train_iters=4
  --set train.log_interval=1 --set train.eval_interval=0 --set train.sample_length=0 --set lr_schedule.warmup_iters=0
  --set checkpoint.save=)
cfg=configs/gpt-nano.yaml
cd "$(dirname "$0")/../.."

run "unknown command suggests the nearest" 2 "unknown command 'trian'; did you mean 'train'" trian "$cfg"
run "--version" 0 "^strata [0-9]+\.[0-9]+\.[0-9]+" --version
run "config path is a directory" 1 "^error: config file configs is a directory" train configs
: >"$work/empty.yaml"
run "empty config" 1 "^error: config file .*empty.yaml is empty" train "$work/empty.yaml"
run "user errors carry no source location" 1 "^error: .*unknown config key 'model.hiden_size'[^[]*$" \
  train "$cfg" --set model.hiden_size=3
STRATA_DEBUG=1 run "STRATA_DEBUG=1 adds the location" 1 "\[src/config/Config.cpp:[0-9]+" \
  train "$cfg" --set model.hiden_size=3
touch "$work/a-file"
run "out_dir is a file" 1 "^error: 'train.out_dir' .*a-file is a file" train "$cfg" "${tiny[@]}" \
  --set "train.out_dir=$work/a-file"
run "out_dir under a file" 1 "^error: 'train.out_dir' .*cannot be created" train "$cfg" "${tiny[@]}" \
  --set "train.out_dir=$work/a-file/run"
run "warm-up longer than the run trains with a warning" 0 "warmup_iters' \(100\) exceeds" train "$cfg" \
  "${tiny[@]}" --set lr_schedule.warmup_iters=100 --set "train.out_dir=$work/warm"
run "diverging run stops non-zero" 1 "^error: training diverged" train "$cfg" "${tiny[@]}" \
  --set train.train_iters=60 --set optimizer.lr=10 --set optimizer.weight_decay=10 --set lr_schedule.style=constant \
  --set "train.out_dir=$work/diverge"

# A run that saves, then what users do with its checkpoint.
run "train and save" 0 "sample from it with: strata generate" train "$cfg" "${tiny[@]}" \
  --set "train.out_dir=$work/run" --set "checkpoint.save=$work/run/ckpt"
[ -f "$work/run/loss.svg" ] || fail "no loss.svg"
run "generate" 0 "." generate "$work/run/ckpt" --prompt "the " --tokens 5 --device cpu
run "generate refuses --tokens 0" 2 "tokens" generate "$work/run/ckpt" --tokens 0
run "generate refuses a negative temperature" 2 "temperature" generate "$work/run/ckpt" --temperature -1
run "generate refuses a negative top-k" 2 "top-k" generate "$work/run/ckpt" --top-k -2
run "convert --hf writes config.json" 0 "config.json" convert "$work/run/ckpt" "$work/hf" --hf
grep -q '"n_layer": 1' "$work/hf/config.json" || fail "config.json lacks n_layer"
[ -f "$work/hf/model.safetensors" ] || fail "no model.safetensors"
step=$(cat "$work/run/ckpt/latest")
cp -r "$work/run/ckpt/$step" "$work/bad-header"
printf '!!!!' | dd of="$work/bad-header/model-rank0.safetensors" bs=1 seek=9 conv=notrunc 2>/dev/null
run "a corrupted tensor file is named" 1 "^error: checkpoint file .*model-rank0.safetensors is corrupted" \
  generate "$work/bad-header" --device cpu
cp -r "$work/run/ckpt/$step" "$work/bad-manifest"
echo '{"step": ' >"$work/bad-manifest/manifest.json"
run "a corrupted manifest is named" 1 "^error: .*bad-manifest/manifest.json is corrupted" generate "$work/bad-manifest"
run "resume into another model is refused" 1 "model.num_layers: 1 in the checkpoint, 2 now" \
  train "$cfg" "${tiny[@]}" --set model.num_layers=2 --set "checkpoint.load=$work/run/ckpt" \
  --set "train.out_dir=$work/run2"

# The zoo: each architecture counted by its own formula.
run "info bert-mini counts BERT's parameters" 0 "^parameters +3325956 " info configs/zoo/bert-mini.yaml
run "info t5-mini counts T5's parameters" 0 "^parameters +7280384 " info configs/zoo/t5-mini.yaml
run "info says t5-mini's head" 0 "^head +head of its own \(lm_head\), decoder output unscaled; gated GELU" info \
  configs/zoo/t5-mini.yaml
run "info shows a position table longer than the sequence" 0 "seq 128 \(512 positions\)" info \
  configs/zoo/bert-mini.yaml --set model.max_position_embeddings=512
run "info zoo lists the architectures and sizes" 0 "^configs/zoo/t5-base.yaml +t5 +span corruption +222.9M" info zoo
# bert-mini and t5-mini through train and generate (tiny shapes, a few steps).
zoo=(--set "data.path=$work/corpus.txt" --set train.device=cpu --set model.num_layers=1 --set model.hidden_size=32
  --set model.num_attention_heads=2 --set model.ffn_hidden_size=64 --set model.seq_length=32
  --set train.micro_batch_size=4 --set train.train_iters=3 --set train.log_interval=1 --set train.eval_interval=3
  --set train.eval_iters=1 --set train.sample_length=4 --set lr_schedule.warmup_iters=0)
for arch in bert t5; do
  run "train $arch-mini" 0 "finished 3 iterations: train loss [0-9.]+, val loss" train "configs/zoo/$arch-mini.yaml" \
    "${zoo[@]}" --set "train.out_dir=$work/$arch" --set "checkpoint.save=$work/$arch/ckpt"
done
run "bert fills each [MASK]" 0 "^\[MASK\] 2:( '[^']+' 0\.[0-9]+){3}$" generate "$work/bert/ckpt" \
  --prompt "the quick [MASK]rown fox [MASK]umps" --top-k 3 --device cpu
run "bert without a [MASK] says what it does" 1 "^error: model.arch bert fills each \[MASK\]" generate \
  "$work/bert/ckpt" --prompt "the quick" --device cpu
run "t5 decodes from the prompt" 0 "." generate "$work/t5/ckpt" --prompt "the quick <extra_id_0> fox" --tokens 4 \
  --device cpu

# HF export and import, every architecture: the imported checkpoint generates exactly what the original did.
declare -A prompts=([gpt]="the " [bert]="the quick [MASK]rown" [t5]="the quick <extra_id_0> fox")
declare -A classes=([gpt]=GPT2LMHeadModel [bert]=BertForMaskedLM [t5]=T5ForConditionalGeneration)
for arch in gpt bert t5; do
  from=$work/$arch/ckpt
  [ "$arch" = gpt ] && from=$work/run/ckpt
  run "convert --hf $arch" 0 "config.json \(HF ${classes[$arch]}" convert "$from" "$work/$arch-hf" --hf
  run "convert --from-hf $arch" 0 "^built $arch \(HF ${classes[$arch]}\): .*layers" convert --from-hf "$work/$arch-hf" \
    "$work/$arch-back"
  # What it built: the head, the activation, the positions.
  grep -Eq "^  (MLM )?head .*; (GELU|ReLU|gated GELU)" <<<"$last" ||
    fail "convert --from-hf $arch does not say what head it built: $last"
  before=$("$strata" generate "$from" --prompt "${prompts[$arch]}" --tokens 4 --device cpu 2>&1)
  after=$("$strata" generate "$work/$arch-back" --prompt "${prompts[$arch]}" --tokens 4 --device cpu 2>&1)
  [ -n "$before" ] && [ "$before" = "$after" ] || fail "$arch: imported from HF it generates '$after', not '$before'"
done
run "convert --from-hf names a missing config.json" 1 "^error: convert --from-hf: no .*/nothing/config.json" \
  convert --from-hf "$work/nothing" "$work/nothing-back"

# Sentence embeddings from the exported BERT with a vocab.txt beside it (BertForMaskedLM's "bert." names): one
# line of hidden-size floats per text, each of unit length.
{
  printf '%s\n' "[PAD]" "[UNK]" "[CLS]" "[SEP]" "[MASK]" the quick brown fox jumps over lazy dog
  for i in $(seq 13 259); do echo "tok$i"; done
} >"$work/bert-hf/vocab.txt"
printf 'the quick brown fox\nthe lazy dog jumps\n' >"$work/texts.txt"
run "embed texts" 0 "^-?[0-9]" embed "$work/bert-hf" --text "The QUICK fox" --file "$work/texts.txt" --device cpu
embeddings=$("$strata" embed "$work/bert-hf" --text "The QUICK fox" --file "$work/texts.txt" --device cpu 2>&1)
echo "$embeddings" | awk 'NF != 32 { bad = 1 } { s = 0; for (i = 1; i <= NF; i++) s += $i * $i; if (s < 0.9999 || s > 1.0001) bad = 1 }
  END { exit bad || NR != 3 }' || fail "embed: expected 3 lines of 32 floats of unit length: $(echo "$embeddings" | cut -c1-80)"
run "embed without a text says how to give one" 1 "^error: embed: no text given" embed "$work/bert-hf" --device cpu
run "tokenize wordpiece" 0 "wrote 8 wordpiece tokens" tokenize "$work/texts.txt" "$work/texts.bin" --tokenizer wordpiece \
  --vocab-file "$work/bert-hf/vocab.txt" --threads 1
[ "$(od -An -v -tu2 "$work/texts.bin" | tr -s ' \n' ' ')" = " 5 6 7 8 5 11 12 9 " ] ||
  fail "tokenize wordpiece: ids $(od -An -v -tu2 "$work/texts.bin" | tr -s ' \n' ' '), expected 5 6 7 8 5 11 12 9"

# Tokenizing a corpus: the byte tokenizer's ids are the bytes.
run "tokenize" 0 "wrote [0-9]+ byte tokens" tokenize "$work/corpus.txt" "$work/corpus.bin" --tokenizer byte --threads 2
[ "$(od -An -v -tu1 "$work/corpus.txt" | tr -s ' \n' ' ')" = "$(od -An -v -tu2 "$work/corpus.bin" | tr -s ' \n' ' ')" ] ||
  fail "tokenize: the .bin is not the corpus's bytes as uint16"
run "tokenize needs the gpt2 files" 1 "needs --vocab-file and --merges-file" tokenize "$work/corpus.txt" "$work/x.bin"

# Interrupts: a long run, stopped once (finishes the step, saves, exits 130), and twice (aborts at once).
long=(train "$cfg" "${tiny[@]}" --set model.num_layers=6 --set model.hidden_size=256 --set model.num_attention_heads=4
  --set model.seq_length=128 --set train.micro_batch_size=16 --set train.train_iters=100000 --set train.threads=1)
interrupt() {
  local name=$1 signals=$2 want=$3 pattern=$4 out=$work/$5
  "$strata" "${long[@]}" --set "train.out_dir=$out" --set "checkpoint.save=$out/ckpt" >"$out.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 600); do grep -q "iteration " "$out.log" 2>/dev/null && break; sleep 0.1; done
  for s in $signals; do kill -"$s" "$pid"; sleep 0.05; done
  wait "$pid"
  local rc=$?
  [ "$rc" -eq "$want" ] || fail "$name: exit status $rc, expected $want: $(tail -3 "$out.log")"
  grep -Eq -- "$pattern" "$out.log" || fail "$name: output lacks /$pattern/: $(tail -3 "$out.log")"
  echo "ok: $name"
}
interrupt "SIGINT saves and exits 130" "INT" 130 "finishing iteration [0-9]+ and saving a checkpoint" int
grep -A1 "resume with:" "$work/int.log" | grep -q -- "strata train .* --resume$" || fail "SIGINT printed no resume command"
[ -f "$work/int/ckpt/latest" ] || fail "SIGINT left no checkpoint"
interrupt "SIGTERM saves and exits 143" "TERM" 143 "stopped by SIGTERM" term
interrupt "a second SIGINT aborts at once" "INT INT" 130 "second interrupt: aborting now" twice
[ ! -f "$work/twice/ckpt/latest" ] || fail "the aborted run wrote a checkpoint"

if [ "$failures" -gt 0 ]; then
  echo "$failures CLI check(s) failed" >&2
  exit 1
fi
echo "all CLI checks passed"
