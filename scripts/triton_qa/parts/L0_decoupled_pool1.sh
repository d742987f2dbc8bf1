# The part of Triton's qa/L0_decoupled/test.sh after its first pass: the Python models'
# trial served with --grpc-max-response-pool-size=1 (its six cases), then the non-decoupled
# repeat_int32 (NonDecoupledTest). The whole script needs about four hours here (its cases
# wait out the models' delays); its first pass is run by test.sh itself. The C++ models'
# trial (on the harness's stand-ins) is left out. Run with
# `run.py --script scripts/triton_qa/parts/L0_decoupled_pool1.sh L0_decoupled` after a
# test.sh run has prepared python_models/.
source ../common/util.sh
RET=0
TEST_RESULT_FILE='test_results.txt'
DECOUPLED_TEST=decoupled_test.py
MODELDIR=`pwd`/python_models
cp -r $DATADIR/qa_model_repository/libtorch_nobatch_int32_int32_int32 $MODELDIR/.
(cd $MODELDIR/libtorch_nobatch_int32_int32_int32 && \
 sed -i "s/dims:.*\[.*\]/dims: \[ 1 \]/g" config.pbtxt)
SERVER_ARGS="--model-repository=$MODELDIR --grpc-max-response-pool-size=1"
SERVER_LOG="./pool1.part.server.log"
CLIENT_LOG=`pwd`/pool1.part.client.log
run_server
if [ "$SERVER_PID" == "0" ]; then cat $SERVER_LOG; exit 1; fi
for test in test_one_to_none test_one_to_one test_one_to_many test_no_streaming \
            test_response_order test_wrong_shape; do
    python $DECOUPLED_TEST DecoupledTest.$test >>$CLIENT_LOG 2>&1 || RET=1
done
kill $SERVER_PID
wait $SERVER_PID
NON_DECOUPLED_DIR=`pwd`/non_decoupled_models
rm -rf ${NON_DECOUPLED_DIR} && mkdir -p ${NON_DECOUPLED_DIR}
cp -r `pwd`/models/repeat_int32 ${NON_DECOUPLED_DIR}/. && \
    (cd ${NON_DECOUPLED_DIR}/repeat_int32 && \
        sed -i "s/decoupled: True/decoupled: False/" config.pbtxt)
SERVER_ARGS="--model-repository=${NON_DECOUPLED_DIR}"
SERVER_LOG="./non_decoupled.part.server.log"
run_server
if [ "$SERVER_PID" == "0" ]; then cat $SERVER_LOG; exit 1; fi
python $DECOUPLED_TEST NonDecoupledTest >>$CLIENT_LOG 2>&1 || RET=1
kill $SERVER_PID
wait $SERVER_PID
exit $RET
