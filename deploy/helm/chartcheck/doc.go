// Package chartcheck holds the tests of the Helm chart deploy/helm/idem-service
// (no cluster needed): `helm lint --strict` and `helm template` for the
// default values and every value set in the chart's ci/ folder, with helm
// itself built from the Go module proxy (helmModule), and each rendered
// object decoded strictly — unknown fields rejected — into its Go API type:
// k8s.io/api for the built-in kinds, the Prometheus Operator's
// monitoring/v1 for ServiceMonitor and PrometheusRule, and KEDA's
// keda/v1alpha1 for ScaledObject. A kind without a type fails. The tests
// then check what the chart promises: the pod name as InstanceID, the
// probes, the termination grace, the console's tokens and TLS, the KEDA
// metric names, and that the alert rules and the dashboard are the files of
// deploy/prometheus and deploy/grafana.
//
// It is a module of its own so that these heavy dependencies stay out of
// idem's go.mod; `make test` runs it (`make chart-test` alone).
package chartcheck
