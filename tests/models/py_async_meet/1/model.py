"""A decoupled ``async def execute`` whose requests wait for each other: each answers once IN
requests are in flight at the same time (or after 60 s, as a failure), with how many it saw.
Only requests that really run concurrently can all see IN."""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.in_flight = 0
        self.changed = None

    async def execute(self, requests):
        await asyncio.gather(*(self.meet(request) for request in requests))
        return None

    async def meet(self, request):
        wanted = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
        if self.changed is None:
            self.changed = asyncio.Condition()
        async with self.changed:
            self.in_flight += 1
            self.changed.notify_all()
            try:
                await asyncio.wait_for(
                    self.changed.wait_for(lambda: self.in_flight >= wanted), 60)
            except TimeoutError:
                pass
            seen = self.in_flight
        sender = request.get_response_sender()
        sender.send(pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUT", np.array([seen], np.float32))]),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
