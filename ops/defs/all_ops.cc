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
void RegisterNnOps();
void RegisterQkvAttentionOps();
void RegisterQkvHeadsOps();
void RegisterReduceOps();
void RegisterRngCounterOps();
void RegisterShapeOps();
void RegisterSoftmaxOps();
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
  RegisterNnOps();
  RegisterQkvAttentionOps();
  RegisterQkvHeadsOps();
  RegisterReduceOps();
  RegisterRngCounterOps();
  RegisterShapeOps();
  RegisterSoftmaxOps();
  RegisterWhereCastOps();
}

}  // namespace tessel
