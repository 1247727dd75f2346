package chartcheck

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// helmModule is the helm command the tests run, built by `go run` from the
// Go module proxy (the first run compiles it, later ones reuse the build
// cache).
const helmModule = "helm.sh/helm/v4/cmd/helm@v4.3.2"

const (
	chart     = "../idem-service"
	release   = "idem"
	namespace = "payments"
	// The sources of the chart's files/ (links in the chart).
	alertsSource    = "../../prometheus/alerts.yml"
	dashboardSource = "../../grafana/dashboards/idem.json"
)

// runHelm runs helm with args and returns its stdout, or an error holding
// its stderr. Helm's cache, config and data go to a folder of the test's.
func runHelm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command("go", append([]string{"run", helmModule}, args...)...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("helm %s: %w\n%s%s", strings.Join(args, " "), err, out.String(), errOut.String())
	}
	return out.String(), nil
}

// valueSets are the chart's defaults ("") and the files of its ci/ folder.
func valueSets(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chart, "ci", "*-values.yaml"))
	if err != nil || len(files) < 3 {
		t.Fatalf("ci value sets: %v %v", files, err)
	}
	return append([]string{""}, files...)
}

func valuesArgs(file string) []string {
	if file == "" {
		return nil
	}
	return []string{"-f", file}
}

func setName(file string) string {
	if file == "" {
		return "defaults"
	}
	return strings.TrimSuffix(filepath.Base(file), "-values.yaml")
}

func TestLint(t *testing.T) {
	for _, v := range valueSets(t) {
		t.Run(setName(v), func(t *testing.T) {
			out, err := runHelm(t, append([]string{"lint", "--strict", chart}, valuesArgs(v)...)...)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out, "0 chart(s) failed") {
				t.Fatalf("helm lint:\n%s", out)
			}
		})
	}
}

// rendered is one value set's objects, decoded.
type rendered struct {
	statefulSets    []*appsv1.StatefulSet
	deployments     []*appsv1.Deployment
	services        []*corev1.Service
	configMaps      []*corev1.ConfigMap
	pdbs            []*policyv1.PodDisruptionBudget
	serviceMonitors []*monitoringv1.ServiceMonitor
	rules           []*monitoringv1.PrometheusRule
	scaledObjects   []*kedav1alpha1.ScaledObject
	kinds           []string
}

// add appends a new T to list and returns it.
func add[T any](list *[]*T) any {
	o := new(T)
	*list = append(*list, o)
	return o
}

// decode decodes one rendered document strictly into the Go type of its
// apiVersion and kind: an unknown field, a wrongly typed value or a kind
// without a type is an error.
func (r *rendered) decode(doc []byte) error {
	var head unstructured.Unstructured
	if err := yaml.Unmarshal(doc, &head.Object); err != nil {
		return err
	}
	if head.Object == nil {
		return nil // an empty document
	}
	gvk := head.GroupVersionKind()
	var into any
	switch gvk.GroupVersion().String() + "/" + gvk.Kind {
	case "apps/v1/StatefulSet":
		into = add(&r.statefulSets)
	case "apps/v1/Deployment":
		into = add(&r.deployments)
	case "v1/Service":
		into = add(&r.services)
	case "v1/ConfigMap":
		into = add(&r.configMaps)
	case "policy/v1/PodDisruptionBudget":
		into = add(&r.pdbs)
	case "monitoring.coreos.com/v1/ServiceMonitor":
		into = add(&r.serviceMonitors)
	case "monitoring.coreos.com/v1/PrometheusRule":
		into = add(&r.rules)
	case "keda.sh/v1alpha1/ScaledObject":
		into = add(&r.scaledObjects)
	default:
		return fmt.Errorf("%s %s: no Go type to validate it against", gvk, head.GetName())
	}
	if err := yaml.UnmarshalStrict(doc, into); err != nil {
		return fmt.Errorf("%s %s: %w", gvk.Kind, head.GetName(), err)
	}
	if head.GetName() == "" {
		return fmt.Errorf("%s without a name", gvk.Kind)
	}
	r.kinds = append(r.kinds, gvk.Kind)
	return nil
}

// render runs helm template with the value file v (and extra args) and
// decodes every object.
func render(t *testing.T, v string, extra ...string) *rendered {
	t.Helper()
	out, err := runHelm(t, append(append([]string{"template", release, chart, "--namespace", namespace}, valuesArgs(v)...), extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(out, "\n") {
		if strings.TrimRight(l, " \t") != l {
			t.Errorf("%s: rendered line %d ends in white space: %q", setName(v), i+1, l)
		}
	}
	r := &rendered{}
	rd := k8syaml.NewYAMLReader(bufio.NewReader(strings.NewReader(out)))
	for {
		doc, err := rd.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := r.decode(doc); err != nil {
			t.Fatalf("%s: %v\n%s", setName(v), err, doc)
		}
	}
	slices.Sort(r.kinds)
	return r
}

// TestRenderedObjectsValidate renders every value set and checks its objects
// against their API types and the chart's promises.
func TestRenderedObjectsValidate(t *testing.T) {
	want := map[string][]string{
		"defaults":     {"PodDisruptionBudget", "Service", "StatefulSet"},
		"minimal":      {"PodDisruptionBudget", "Service", "StatefulSet"},
		"full":         {"ConfigMap", "Deployment", "PodDisruptionBudget", "PrometheusRule", "ScaledObject", "Service", "Service", "ServiceMonitor", "ServiceMonitor", "StatefulSet"},
		"console-only": {"Deployment", "Service", "ServiceMonitor"},
	}
	for _, v := range valueSets(t) {
		t.Run(setName(v), func(t *testing.T) {
			r := render(t, v)
			if w, ok := want[setName(v)]; !ok || !reflect.DeepEqual(r.kinds, w) {
				t.Fatalf("objects %v, want %v", r.kinds, w)
			}
			for _, s := range r.statefulSets {
				checkStatefulSet(t, s, r)
			}
			for _, d := range r.deployments {
				checkConsole(t, d)
			}
			for _, so := range r.scaledObjects {
				checkScaledObject(t, so, r.statefulSets)
			}
			checkSelectors(t, r)
		})
	}
}

// checkStatefulSet: the pod name reaches the service as its InstanceID
// (downward API), the probes hit /healthz and /readyz on the metrics port,
// the termination grace is ShutdownGrace + commit + close, requests are
// set, and the governing Service is headless.
func checkStatefulSet(t *testing.T, s *appsv1.StatefulSet, r *rendered) {
	t.Helper()
	spec := s.Spec.Template.Spec
	c := spec.Containers[0]
	var podName bool
	for _, e := range c.Env {
		if e.Name == "POD_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name" {
			podName = true
		}
	}
	if !podName || !slices.Contains(c.Args, "-instance-id=$(POD_NAME)") {
		t.Errorf("statefulset %s: POD_NAME from metadata.name %v, args %v: want the pod name as -instance-id", s.Name, podName, c.Args)
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" || c.LivenessProbe.HTTPGet.Port.String() != "metrics" ||
		c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.ReadinessProbe.HTTPGet.Port.String() != "metrics" {
		t.Errorf("statefulset %s: probes %+v %+v", s.Name, c.LivenessProbe, c.ReadinessProbe)
	}
	// The defaults: 10 s ShutdownGrace + 5 s commit + 5 s close; ci/full: 25 + 5 + 5.
	if g := spec.TerminationGracePeriodSeconds; g == nil || (*g != 20 && *g != 35) {
		t.Errorf("statefulset %s: terminationGracePeriodSeconds %v, want ShutdownGrace + commit + close", s.Name, g)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Errorf("statefulset %s: no resource requests", s.Name)
	}
	var governing *corev1.Service
	for _, svc := range r.services {
		if svc.Name == s.Spec.ServiceName {
			governing = svc
		}
	}
	if governing == nil || governing.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("statefulset %s: governing Service %q missing or not headless", s.Name, s.Spec.ServiceName)
	}
	if len(r.scaledObjects) > 0 && s.Spec.Replicas != nil {
		t.Errorf("statefulset %s: replicas %d set while KEDA scales it", s.Name, *s.Spec.Replicas)
	}
}

// checkConsole: the console serves behind its tokens file, and over TLS
// from its Secret unless it is behind a proxy.
func checkConsole(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	c := d.Spec.Template.Spec.Containers[0]
	args := strings.Join(c.Args, " ")
	if c.Args[0] != "console" || !strings.Contains(args, "--tokens-file=/etc/idem/console/") || strings.Contains(args, "--insecure-no-auth") {
		t.Errorf("console args %q: want console --tokens-file", args)
	}
	tls := strings.Contains(args, "--http-tls-cert=/etc/idem/console-tls/tls.crt") && strings.Contains(args, "--http-tls-key=/etc/idem/console-tls/tls.key")
	if tls == strings.Contains(args, "--behind-proxy") {
		t.Errorf("console args %q: want TLS or --behind-proxy, one of them", args)
	}
	secrets := map[string]bool{}
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			secrets[v.Name] = true
		}
	}
	if !secrets["tokens"] || secrets["tls"] != tls {
		t.Errorf("console secret volumes %v (TLS %v)", secrets, tls)
	}
}

// checkScaledObject: KEDA scales the StatefulSet on the two lag metrics
// that count only work a pod can start.
func checkScaledObject(t *testing.T, so *kedav1alpha1.ScaledObject, sets []*appsv1.StatefulSet) {
	t.Helper()
	if len(sets) != 1 || so.Spec.ScaleTargetRef.Kind != "StatefulSet" || so.Spec.ScaleTargetRef.Name != sets[0].Name {
		t.Errorf("scaledobject target %+v", so.Spec.ScaleTargetRef)
	}
	var queries []string
	for _, tr := range so.Spec.Triggers {
		if tr.Type != "prometheus" || tr.Metadata["serverAddress"] == "" || tr.Metadata["threshold"] == "" {
			t.Errorf("trigger %+v", tr)
		}
		queries = append(queries, tr.Metadata["query"])
	}
	want := []string{`sum(idem_consumer_lag_actionable{group="payments-consumer"})`, `max(idem_consumer_lag_seconds{group="payments-consumer"})`}
	if !reflect.DeepEqual(queries, want) {
		t.Errorf("queries %q, want %q", queries, want)
	}
}

// checkSelectors: every selector selects the pods of its component.
func checkSelectors(t *testing.T, r *rendered) {
	t.Helper()
	pods := map[string]map[string]string{}
	for _, s := range r.statefulSets {
		pods[s.Name] = s.Spec.Template.Labels
		if !subset(s.Spec.Selector.MatchLabels, s.Spec.Template.Labels) {
			t.Errorf("statefulset %s selects no pod of its own", s.Name)
		}
	}
	for _, d := range r.deployments {
		pods[d.Name] = d.Spec.Template.Labels
		if !subset(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
			t.Errorf("deployment %s selects no pod of its own", d.Name)
		}
	}
	selects := func(sel map[string]string) bool {
		for _, l := range pods {
			if subset(sel, l) {
				return true
			}
		}
		return false
	}
	for _, s := range r.services {
		if !selects(s.Spec.Selector) {
			t.Errorf("service %s selects no pod", s.Name)
		}
	}
	for _, p := range r.pdbs {
		if !selects(p.Spec.Selector.MatchLabels) {
			t.Errorf("pdb %s selects no pod", p.Name)
		}
	}
	for _, sm := range r.serviceMonitors {
		found := false
		for _, s := range r.services {
			if subset(sm.Spec.Selector.MatchLabels, s.Labels) {
				found = slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == sm.Spec.Endpoints[0].Port })
			}
		}
		if !found {
			t.Errorf("servicemonitor %s selects no service with port %q", sm.Name, sm.Spec.Endpoints[0].Port)
		}
	}
}

func subset(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestMonitoringFilesAreTheSources: the chart's alert rules and dashboard
// are deploy/prometheus/alerts.yml and deploy/grafana/dashboards/idem.json:
// its files/ hold the same bytes (they are links), the PrometheusRule's
// groups decode to the same rules as the source (strictly, as the
// Operator's type), and the dashboard ConfigMap holds the source's bytes.
func TestMonitoringFilesAreTheSources(t *testing.T) {
	for chartFile, src := range map[string]string{"files/alerts.yml": alertsSource, "files/idem.json": dashboardSource} {
		a, err := os.ReadFile(filepath.Join(chart, chartFile))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from %s: make it a link again (ln -sf %s %s)", chartFile, src, strings.TrimPrefix(src, "../"), chartFile)
		}
	}
	r := render(t, filepath.Join(chart, "ci", "full-values.yaml"))
	src, err := os.ReadFile(alertsSource)
	if err != nil {
		t.Fatal(err)
	}
	var want monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(src, &want); err != nil {
		t.Fatalf("%s as a PrometheusRule spec: %v", alertsSource, err)
	}
	if len(r.rules) != 1 || !reflect.DeepEqual(r.rules[0].Spec, want) {
		t.Fatalf("the PrometheusRule's spec is not %s's rules", alertsSource)
	}
	dash, err := os.ReadFile(dashboardSource)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.configMaps) != 1 || r.configMaps[0].Data["idem.json"] != string(dash) {
		t.Fatalf("the dashboard ConfigMap does not hold %s byte for byte", dashboardSource)
	}
}

// TestRefusals: value sets that cannot work fail at render time with a
// message naming the value to set.
func TestRefusals(t *testing.T) {
	for _, tt := range []struct {
		name string
		set  []string
		want string
	}{
		{"console without tokens", []string{"console.enabled=true", "console.tls.secretName=tls"}, "console.tokensSecret.name is required"},
		{"console without TLS", []string{"console.enabled=true", "console.tokensSecret.name=tokens"}, "console.tls.secretName is required"},
		{"SASL without password", []string{"kafka.sasl.mechanism=SCRAM-SHA-512", "kafka.sasl.user=u"}, "kafka.sasl.passwordSecret.name is required"},
		{"OAuth without client secret", []string{"kafka.sasl.mechanism=OAUTHBEARER", "kafka.sasl.oauth.tokenURL=https://idp/token", "kafka.sasl.oauth.clientID=c"}, "kafka.sasl.oauth.clientSecretSecret.name is required"},
		{"a misspelt value (values.schema.json)", []string{"service.replica=2"}, "replica"},
		{"an unknown SASL mechanism", []string{"kafka.sasl.mechanism=GSSAPI"}, "GSSAPI"},
		{"KEDA minimum above maximum", []string{"autoscaling.keda.enabled=true", "autoscaling.keda.minReplicas=5", "autoscaling.keda.maxReplicas=2"}, "minReplicas 5 is above maxReplicas 2"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := []string{"template", release, chart}
			for _, s := range tt.set {
				args = append(args, "--set", s)
			}
			_, err := runHelm(t, args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("%v, want a failure mentioning %q", err, tt.want)
			}
		})
	}
}
