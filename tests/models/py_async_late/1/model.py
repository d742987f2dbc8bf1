"""A decoupled ``async def execute`` that returns at once and answers later, from tasks it
started (Triton runs the model's event loop on after execute returns): three responses, each
after ``asyncio.sleep`` of a NumPy number, then the final flag."""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            asyncio.get_running_loop().create_task(
                self.answer(request.get_response_sender(), value))
        return None

    async def answer(self, sender, value):
        for k in range(3):
            await asyncio.sleep(np.float32(0.02))
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", (value + k).astype(np.float32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
