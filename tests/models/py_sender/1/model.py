import asyncio
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _value(request, name):
    return int(pb_utils.get_input_tensor_by_name(request, name).as_numpy().sum())


class TritonPythonModel:
    """Exercises the response sender's rules (decoupled or not, by its config). Per request:
    PRE responses sent during execute (INDEX 1000, 1001, ...), then the final flag if
    PRE_FINAL; a returned response (INDEX 0) if RETURN; after execute returned, from a
    thread, POST responses (INDEX 2000, ...) then the final flag if POST_FINAL. What a send
    after the return raises goes to the log as "post-return send refused: <message>". With
    the parameter ``use_async``, execute is an ``async def`` and the sends after the return
    come from an asyncio task."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.tasks = set()
        if "use_async" in config.get("parameters", {}):
            self.execute = self._execute_async

    async def _execute_async(self, requests):
        return self._run(requests, self._later_task)

    def execute(self, requests):
        return self._run(requests, self._later_thread)

    def _later_thread(self, later):
        threading.Thread(target=self._after, args=(later,), daemon=True).start()

    def _later_task(self, later):
        async def after():
            await asyncio.sleep(0.1)  # after execute returned
            self._send_later(later)

        task = asyncio.get_running_loop().create_task(after())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _run(self, requests, schedule):
        later = []
        returned = []
        for request in requests:
            pre, post = _value(request, "PRE"), _value(request, "POST")
            pre_final, post_final = _value(request, "PRE_FINAL"), _value(request, "POST_FINAL")
            sender = None
            if pre or post or pre_final or post_final:
                sender = request.get_response_sender()
            for i in range(pre):
                sender.send(self._response(1000 + i))
            if pre_final:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            later.append((sender, post, post_final))
            returned.append(self._response(0) if _value(request, "RETURN") else None)
        schedule(later)
        if all(r is None for r in returned):
            return None
        return returned

    @staticmethod
    def _response(index):
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor("INDEX", np.array([index], np.uint16))])

    def _after(self, later):
        time.sleep(0.1)  # after execute returned
        self._send_later(later)

    def _send_later(self, later):
        for sender, post, post_final in later:
            try:
                for i in range(post):
                    sender.send(self._response(2000 + i))
                if post_final:
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except pb_utils.TritonModelException as exc:
                pb_utils.Logger.log_error(f"post-return send refused: {exc.message()}")
