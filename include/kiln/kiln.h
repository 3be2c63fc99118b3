// kiln — umbrella header.
#pragma once
#include "kiln/allocator.h"
#include "kiln/array.h"
#include "kiln/compiler.h"
#include "kiln/device.h"
#include "kiln/distributed.h"
#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/ops.h"
#include "kiln/random.h"
#include "kiln/shape.h"
#include "kiln/transforms.h"
