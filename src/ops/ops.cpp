// The ops layer is contracts only; this file keeps the library non-empty and
// holds the out-of-line anchor of the Backend vtable.
#include "ops/backend.h"
