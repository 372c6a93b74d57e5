// Every op definition file, registered once on first use of the registry.
// Adding an op file: declare and call its Register*Ops() here.
namespace tessel {

void RegisterActivationOps();
void RegisterAttentionOps();
void RegisterCrossEntropyOps();
void RegisterElementwiseOps();
void RegisterLayerNormOps();
void RegisterLinearOps();
void RegisterMatmulOps();
void RegisterMicroBatchOps();
void RegisterMicroBatchSumOps();
void RegisterNnOps();
void RegisterQkvAttentionOps();
void RegisterQkvHeadsOps();
void RegisterReduceOps();
void RegisterRmsNormOps();
void RegisterRngCounterOps();
void RegisterRotaryOps();
void RegisterShapeOps();
void RegisterSoftmaxOps();
void RegisterSwigluOps();
void RegisterWhereCastOps();

void RegisterAllOps() {
  RegisterActivationOps();
  RegisterAttentionOps();
  RegisterCrossEntropyOps();
  RegisterElementwiseOps();
  RegisterLayerNormOps();
  RegisterLinearOps();
  RegisterMatmulOps();
  RegisterMicroBatchOps();
  RegisterMicroBatchSumOps();
  RegisterNnOps();
  RegisterQkvAttentionOps();
  RegisterQkvHeadsOps();
  RegisterReduceOps();
  RegisterRmsNormOps();
  RegisterRngCounterOps();
  RegisterRotaryOps();
  RegisterShapeOps();
  RegisterSoftmaxOps();
  RegisterSwigluOps();
  RegisterWhereCastOps();
}

}  // namespace tessel
