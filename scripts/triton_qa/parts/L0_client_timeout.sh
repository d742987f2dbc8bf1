# The Python half of Triton's qa/L0_client_timeout/test.sh, run with
# `run.py --script scripts/triton_qa/parts/L0_client_timeout.sh L0_client_timeout`: the
# script's first half runs Triton's C++ client_timeout_test (not built here) and stops the
# script before its Python cases when that fails. These are its second and third servers as
# test.sh starts them (same flags, same TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC), and its
# Python cases in its order; each case's result is recorded by the harness's unittest hook.
source ../common/util.sh
DATADIR=`pwd`/models
mkdir -p $DATADIR/custom_identity_int32/1
RET=0
CLIENT_LOG=`pwd`/client.part.log
rm -f $CLIENT_LOG server.part*.log

SERVER_ARGS="--model-repository=$DATADIR --log-verbose 2"
SERVER_LOG="./server.part1.log"
run_server
if [ "$SERVER_PID" == "0" ]; then cat $SERVER_LOG; exit 1; fi
for i in test_grpc_infer test_grpc_async_infer test_grpc_stream_infer test_http_infer \
         test_http_async_infer; do
    python client_infer_timeout_test.py ClientInferTimeoutTest.$i >> $CLIENT_LOG 2>&1 || RET=1
done
kill $SERVER_PID
wait $SERVER_PID

export TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC=2
SERVER_ARGS="${SERVER_ARGS} --model-control-mode=explicit --allow-client-shm=true --load-model=custom_identity_int32 --log-verbose 2"
SERVER_LOG="./server.part2.log"
run_server
if [ "$SERVER_PID" == "0" ]; then cat $SERVER_LOG; exit 1; fi
python client_non_infer_timeout_test.py >> $CLIENT_LOG 2>&1 || RET=1
kill $SERVER_PID
wait $SERVER_PID
exit $RET
