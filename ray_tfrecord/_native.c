#include <Python.h>
static struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, NULL};
PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&m); }
