# The C++ models' trial of Triton's qa/L0_decoupled/test.sh (its `custom` pass: the models
# under models/, served by the harness's stand-ins for Triton's C++ test backends), first
# with the default response pool (its seven cases, test_one_to_multi_many with Triton's
# 2 s gRPC response delay) and, with POOL1=1, with --grpc-max-response-pool-size=1 (six
# cases). Each half takes about an hour here (the cases wait out the models' delays). Run with
# `run.py --script scripts/triton_qa/parts/L0_decoupled_custom.sh L0_decoupled` after a
# test.sh run has prepared models/.
source ../common/util.sh
RET=0
TEST_RESULT_FILE='test_results.txt'
DECOUPLED_TEST=decoupled_test.py
MODELDIR=`pwd`/models
cp -r $DATADIR/qa_model_repository/libtorch_nobatch_int32_int32_int32 $MODELDIR/.
(cd $MODELDIR/libtorch_nobatch_int32_int32_int32 && \
 sed -i "s/dims:.*\[.*\]/dims: \[ 1 \]/g" config.pbtxt)
CLIENT_LOG=`pwd`/custom.part.client.log
if [ -z "$POOL1" ]; then
    SERVER_ARGS="--model-repository=$MODELDIR"
    SERVER_LOG="./custom.part.server.log"
else
    SERVER_ARGS="--model-repository=$MODELDIR --grpc-max-response-pool-size=1"
    SERVER_LOG="./custom_pool1.part.server.log"
fi
run_server
if [ "$SERVER_PID" == "0" ]; then cat $SERVER_LOG; exit 1; fi
for test in test_one_to_none test_one_to_one test_one_to_many test_no_streaming \
            test_response_order test_wrong_shape; do
    python $DECOUPLED_TEST DecoupledTest.$test >>$CLIENT_LOG 2>&1 || RET=1
done
if [ -z "$POOL1" ]; then
    export TRITONSERVER_DELAY_GRPC_RESPONSE=2000
    python $DECOUPLED_TEST DecoupledTest.test_one_to_multi_many >>$CLIENT_LOG 2>&1 || RET=1
    unset TRITONSERVER_DELAY_GRPC_RESPONSE
fi
kill $SERVER_PID
wait $SERVER_PID
exit $RET
