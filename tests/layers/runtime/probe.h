// A planted back-edge for layers.CatchesBackEdges: a lower layer including a higher one's header.
#pragma once
#include "autotune/tuner.h"
