// The umbrella header of tessel's public API: #include <tessel/tessel.h>.
#pragma once

#include <glog/logging.h>  // LOG(INFO) in user programs, as in the examples

#include "core/comm/communicator.h"
#include "core/comm/process_group.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/init.h"
#include "core/philox.h"
#include "core/shape.h"
#include "core/tensor.h"
#include "graph/autograd.h"
#include "graph/boxing_executor.h"
#include "graph/global_tensor_ops.h"
#include "layers/dist.h"
#include "layers/linear.h"
#include "layers/module.h"
#include "layers/optimizer.h"
#include "layers/regularization.h"
#include "layers/transformer.h"
#include "models/gpt.h"
#include "ops/functional.h"
#include "sbp/boxing_plan.h"
#include "sbp/global_tensor.h"
#include "sbp/placement.h"
#include "sbp/sbp.h"
