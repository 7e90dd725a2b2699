# The training rows that `make bench` (bench/run.sh) and `make bench-compile` (bench/compile.sh)
# share. Sourced from the repository's root.

# training_rows EACH: calls `EACH NAME MODEL "PPC DIMS" "JAX ARGS" REMAT` for the training step
# of the MLP, of the transformer example and of GPT-2 at a size a user trains on a CPU, with each
# rematerialization.
training_rows() {
  local each=$1 remat
  for remat in stage none; do
    $each "train --remat=$remat: mlp d=256 h=1024" examples/mlp.ppc "" "" $remat
    $each "train --remat=$remat: transformer (example)" examples/transformer.ppc "" \
      "--model transformer --b 2 --t 16 --heads 4 --dh 16" $remat
    $each "train --remat=$remat: gpt2 d=256 t=256 L=8" examples/gpt2.ppc \
      "--dim t=256 --dim heads=4 --dim dh=64 --layers 8" \
      "--model gpt2 --b 2 --t 256 --heads 4 --dh 64 --microbatches 4" $remat
  done
}

# The size (#34): d = 1024, 8 layers, 101 M parameters, 8 microbatches of 4 × 256.
scale_dims="--dim b=4 --dim t=256 --dim heads=16 --dim dh=64"
scale_jax="--model transformer --b 4 --t 256 --heads 16 --dh 64"
