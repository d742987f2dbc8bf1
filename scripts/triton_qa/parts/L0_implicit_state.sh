# The part of Triton's qa/L0_implicit_state/test.sh that does not need its C++
# `implicit_state` test backend (five of its client's seven cases load models on it, and its
# one server loads them all, so test.sh cannot start here): the ONNX and LibTorch implicit-state
# models set up as test.sh sets them up (the `_output` copies list the state as an output), one
# server over only those, and the client's two cases that use them. Run with
# `run.py --script scripts/triton_qa/parts/L0_implicit_state.sh L0_implicit_state`.
source ../common/util.sh
export BACKENDS=${BACKENDS:="libtorch onnx"}
export IMPLICIT_STATE=1
MODELDIR=`pwd`/models_part
rm -rf $MODELDIR && mkdir -p $MODELDIR
for BACKEND in $BACKENDS; do
    model_name=${BACKEND}_nobatch_sequence_int32
    cp -r $DATADIR/qa_sequence_implicit_model_repository/$model_name $MODELDIR
    model_name_allow_output=${model_name}_output
    cp -r $DATADIR/qa_sequence_implicit_model_repository/$model_name $MODELDIR/$model_name_allow_output
    state=OUTPUT_STATE
    if [ $BACKEND == "libtorch" ]; then state=OUTPUT_STATE__1; fi
    (cd $MODELDIR/$model_name_allow_output && \
        sed -i "s/^name:.*/name: \"$model_name_allow_output\"/" config.pbtxt && \
        echo -e "output [{ name: \"$state\" \n data_type: TYPE_INT32 \n dims: [ 1 ] }]" >> config.pbtxt)
done
SERVER_ARGS="--backend-directory=${BACKEND_DIR} --model-repository=${MODELDIR}"
SERVER_LOG="./server.part.log"
run_server
if [ "$SERVER_PID" == "0" ]; then cat $SERVER_LOG; exit 1; fi
RET=0
for case in test_request_output_not_allowed test_request_output; do
    python3 implicit_state.py ImplicitStateTest.$case >> client.part.log 2>&1 || RET=1
done
kill $SERVER_PID
wait $SERVER_PID
exit $RET
