"""Part of py_split's model, imported relatively."""


def double(values):
    return values * 2
