# The second half of Triton's qa/L0_implicit_state/test.sh on its own: L0_sequence_batcher's
# test.sh with IMPLICIT_STATE=1 and ENSEMBLES=0, as test.sh runs it, over the backends this
# machine has (test.sh's default adds TensorRT's `plan`). MODEL_TRIALS passes through (the
# script's default is "0 1 2 4 v"). Run with
# `run.py --script scripts/triton_qa/parts/L0_implicit_state_sequence.sh L0_implicit_state`.
export ENSEMBLES=0
export BACKENDS=${BACKENDS:="libtorch onnx"}
export IMPLICIT_STATE=1
export INITIAL_STATE_ZERO=${INITIAL_STATE_ZERO:="0"}
export INITIAL_STATE_FILE=${INITIAL_STATE_FILE:="0"}
export SINGLE_STATE_BUFFER=${SINGLE_STATE_BUFFER:="0"}
cd ../L0_sequence_batcher/ && bash -ex test.sh
