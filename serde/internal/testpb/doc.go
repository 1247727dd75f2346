// Package testpb is the protobuf messages of package serde's tests,
// generated from orders.proto.
package testpb
