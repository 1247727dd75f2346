// Package shippingpb is the typed-orders example's protobuf messages,
// generated from shipping.proto, and their schema.
package shippingpb
