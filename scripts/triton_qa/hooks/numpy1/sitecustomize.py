"""On the server's PYTHONPATH under the qa harness (standin.py): NumPy 1's ``np.NINF`` for
Triton's Python models, as in Triton's container (see nursery_qa_numpy1.py)."""
import nursery_qa_numpy1

nursery_qa_numpy1.install()
