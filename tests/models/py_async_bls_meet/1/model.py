"""A decoupled ``async def execute`` that forwards each request to py_async_meet with
``await async_exec(decoupled=True)`` and sends on what comes back (Triton's qa
async_execute_decouple_bls shape): its requests reach py_async_meet together only if an
``async_exec`` stream does not hold the event loop while the target has not answered yet."""

import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        await asyncio.gather(*(self.forward(request) for request in requests))
        return None

    async def forward(self, request):
        call = pb_utils.InferenceRequest(
            model_name="py_async_meet", requested_output_names=["OUT"],
            inputs=[pb_utils.get_input_tensor_by_name(request, "IN")])
        sender = request.get_response_sender()
        for response in await call.async_exec(decoupled=True):
            out = pb_utils.get_output_tensor_by_name(response, "OUT")
            if out is not None:
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUT", out.as_numpy())]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
