package shippingpb

import _ "embed" // for Proto

// Proto is shipping.proto, the schema the example registers for the
// shipments topic (the registry stores .proto text).
//
//go:embed shipping.proto
var Proto string
