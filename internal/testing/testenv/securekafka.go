package testenv

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/kafkaauth"
)

// SecureKafka is a broker of its own, started for one test, whose client
// listener is SASL_SSL: TLS with a self-signed broker certificate made by
// keytool, client certificates required, and SASL PLAIN, SCRAM-SHA-256 and
// SCRAM-SHA-512 for one user (the SCRAM credentials are created when the
// storage is formatted, with kafka-storage's --add-scram).
//
// Its embedded *Kafka (Topic, CreateTopic, Producer, Admin, …) talks to the
// SASL_SSL listener with SCRAM-SHA-512.
type SecureKafka struct {
	*Kafka
	// CAFile is the PEM of the broker's certificate, which clients trust.
	CAFile string
	// CertFile and KeyFile are a client certificate and key the broker
	// accepts.
	CertFile, KeyFile string
	// User and Password are valid for every SASL mechanism.
	User, Password string
	// Dir holds the broker's configuration, data and logs.
	Dir string
}

// Auth returns the client settings for mechanism ("PLAIN",
// "SCRAM-SHA-256" or "SCRAM-SHA-512"), with the CA and client certificate.
func (k *SecureKafka) Auth(mechanism string) kafkaauth.Options {
	return kafkaauth.Options{CAFile: k.CAFile, CertFile: k.CertFile, KeyFile: k.KeyFile,
		Mechanism: mechanism, User: k.User, Password: k.Password}
}

// KafkaLibs returns the folder of the Kafka broker jars that scripts/services.sh
// fetches: $IDEM_KAFKA_LIBS, else $IDEM_STATE/kafka/libs, else
// <repository>/.state/kafka/libs. When the default folder holds no broker jar
// (services ran in Docker) and mvn is installed, it fetches them there the
// way services.sh does (tools/kafka/pom.xml); otherwise it fails the test,
// naming the fix.
func KafkaLibs(tb testing.TB) string {
	tb.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..", "..")
	dir := os.Getenv("IDEM_KAFKA_LIBS")
	fetch := dir == ""
	if dir == "" {
		state := os.Getenv("IDEM_STATE")
		if state == "" {
			state = filepath.Join(root, ".state")
		}
		dir = filepath.Join(state, "kafka", "libs")
	}
	has := func() bool {
		jars, _ := filepath.Glob(filepath.Join(dir, "kafka_2.13-*.jar"))
		return len(jars) > 0
	}
	if !has() && fetch {
		if _, err := exec.LookPath("mvn"); err == nil {
			tb.Logf("testenv: fetching the Kafka jars into %s with mvn", dir)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				tb.Fatal(err)
			}
			pom := filepath.Join(root, "tools", "kafka", "pom.xml")
			runTool(tb, root, "mvn", "-q", "-B", "-f", pom, "dependency:copy-dependencies", "-DoutputDirectory="+dir)
			// The stamp services.sh keeps beside the jars, so it does not fetch them again.
			if b, err := os.ReadFile(pom); err == nil {
				sum := sha256.Sum256(b)
				_ = os.WriteFile(filepath.Join(dir, ".stamp"), []byte(hex.EncodeToString(sum[:])[:16]+"\n"), 0o644)
			}
		}
	}
	if !has() {
		tb.Fatalf("testenv: no Kafka broker jars in %s: run `make services` first (it fetches them), or set IDEM_KAFKA_LIBS", dir)
	}
	return dir
}

// freePorts returns n TCP ports that were free a moment ago, below Linux's
// ephemeral range (FreePortRange): a port the kernel hands out for
// ":0" is one an outgoing connection may take before the broker binds it.
func freePorts(tb testing.TB, n int) []int {
	tb.Helper()
	base := FreePortRange(tb, n)
	ports := make([]int, n)
	for i := range ports {
		ports[i] = base + i
	}
	return ports
}

// randomToken returns n random bytes in URL-safe base64 without padding.
func randomToken(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// runTool runs a program in dir and fails the test with its output on error.
func runTool(tb testing.TB, dir, name string, args ...string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("testenv: %s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// writeClientCert writes a self-signed ECDSA client certificate and its key
// as PEM files.
func writeClientCert(tb testing.TB, certFile, keyFile string) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "idem-test-client"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(48 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		IsCA:         true, BasicConstraintsValid: true, // self-signed: its own trust anchor in the broker's truststore
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		tb.Fatal(err)
	}
}

// NewSecureKafka starts a SecureKafka in a temporary folder on free ports
// (PLAINTEXT between broker and controller only, SASL_SSL for clients) and
// stops it when the test ends. Keys and certificates are made at test time
// (keytool, from the JDK that runs Kafka); nothing is read from the
// repository but the jars of KafkaLibs. It needs java and keytool on PATH.
func NewSecureKafka(tb testing.TB) *SecureKafka {
	tb.Helper()
	SkipIfShort(tb)
	libs := KafkaLibs(tb)
	dir := tb.TempDir()
	k := &SecureKafka{Dir: dir, User: "idemtest", Password: randomToken(18),
		CAFile: filepath.Join(dir, "broker.pem"), CertFile: filepath.Join(dir, "client.pem"), KeyFile: filepath.Join(dir, "client-key.pem")}
	storePass := randomToken(18)

	// The broker's key pair and self-signed certificate for 127.0.0.1, in a
	// PKCS12 keystore; its certificate is what clients trust.
	keystore, truststore := filepath.Join(dir, "broker.p12"), filepath.Join(dir, "trust.p12")
	runTool(tb, dir, "keytool", "-genkeypair", "-alias", "broker", "-keyalg", "EC", "-groupname", "secp256r1",
		"-sigalg", "SHA256withECDSA", "-dname", "CN=localhost", "-ext", "SAN=ip:127.0.0.1,dns:localhost", "-validity", "2",
		"-keystore", keystore, "-storetype", "PKCS12", "-storepass", storePass, "-keypass", storePass)
	runTool(tb, dir, "keytool", "-exportcert", "-alias", "broker", "-rfc", "-file", k.CAFile,
		"-keystore", keystore, "-storetype", "PKCS12", "-storepass", storePass)
	// The client's certificate, trusted by the broker.
	writeClientCert(tb, k.CertFile, k.KeyFile)
	runTool(tb, dir, "keytool", "-importcert", "-noprompt", "-alias", "client", "-file", k.CertFile,
		"-keystore", truststore, "-storetype", "PKCS12", "-storepass", storePass)

	ports := freePorts(tb, 3)
	plain, secure, ctrl := ports[0], ports[1], ports[2]
	addr := "127.0.0.1:" + strconv.Itoa(secure)
	jaas := func(module, extra string) string {
		return "org.apache.kafka.common.security." + module + " required" + extra + ";"
	}
	props := oneNodeProps(dir, plain, ctrl, "SASL_SSL", addr)
	for key, v := range map[string]string{
		"sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
		"listener.name.sasl_ssl.plain.sasl.jaas.config": jaas("plain.PlainLoginModule",
			fmt.Sprintf(" user_%s=%q", k.User, k.Password)),
		"listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": jaas("scram.ScramLoginModule", ""),
		"listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": jaas("scram.ScramLoginModule", ""),
		"listener.name.sasl_ssl.ssl.client.auth":                "required",
		"ssl.keystore.location":                                 keystore,
		"ssl.keystore.type":                                     "PKCS12",
		"ssl.keystore.password":                                 storePass,
		"ssl.key.password":                                      storePass,
		"ssl.truststore.location":                               truststore,
		"ssl.truststore.type":                                   "PKCS12",
		"ssl.truststore.password":                               storePass,
	} {
		props[key] = v
	}
	scram := fmt.Sprintf("[name=%s,password=%s]", k.User, k.Password)
	exited := startBroker(tb, dir, libs, props, nil, "--add-scram", "SCRAM-SHA-256="+scram, "--add-scram", "SCRAM-SHA-512="+scram)

	base := sarama.NewConfig()
	if err := kafkaauth.Apply(base, k.Auth("SCRAM-SHA-512")); err != nil {
		tb.Fatal(err)
	}
	k.Kafka = &Kafka{Brokers: []string{addr}, Kind: "secure", configure: func(c *sarama.Config) {
		c.Net.TLS, c.Net.SASL = base.Net.TLS, base.Net.SASL
	}}
	Eventually(tb, 3*time.Minute, func() error {
		brokerAlive(tb, dir, exited)
		return brokerReady(k.Brokers, k.SaramaConfig())
	})
	tb.Logf("testenv: secure kafka (SASL_SSL) on %s, files in %s", addr, dir)
	return k
}

// brokerReady reports whether brokers answer a metadata request made with
// cfg with a broker and a controller.
func brokerReady(brokers []string, cfg *sarama.Config) error {
	c, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	if len(c.Brokers()) == 0 {
		return errors.New("no broker in metadata")
	}
	_, err = c.Controller()
	return err
}

// tail returns the last lines mentioning an error in files, for a failure
// message.
func tail(files ...string) string {
	var lines []string
	for _, f := range files {
		b, _ := os.ReadFile(f)
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "ERROR") || strings.Contains(l, "Exception") {
				lines = append(lines, l)
			}
		}
	}
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, "\n")
}

// startBroker writes props as dir/server.properties, formats the storage
// (with formatArgs, e.g. --add-scram) and starts a one-node Kafka from the
// jars in libs, with the extra JVM system properties jvm; the broker is
// killed when the test ends. The returned channel is closed when it exits.
func startBroker(tb testing.TB, dir, libs string, props map[string]string, jvm []string, formatArgs ...string) <-chan struct{} {
	tb.Helper()
	var conf bytes.Buffer
	for key, v := range props {
		fmt.Fprintf(&conf, "%s=%s\n", key, strings.ReplaceAll(v, `\`, `\\`))
	}
	serverProps, log4j := filepath.Join(dir, "server.properties"), filepath.Join(dir, "log4j2.properties")
	if err := os.WriteFile(serverProps, conf.Bytes(), 0o600); err != nil {
		tb.Fatal(err)
	}
	logConf := "status = warn\nappender.file.type = File\nappender.file.name = file\nappender.file.fileName = " +
		filepath.Join(dir, "server.log") + "\nappender.file.layout.type = PatternLayout\nappender.file.layout.pattern = [%d] %p %m (%c)%n\n" +
		"rootLogger.level = INFO\nrootLogger.appenderRef.file.ref = file\n"
	if err := os.WriteFile(log4j, []byte(logConf), 0o600); err != nil {
		tb.Fatal(err)
	}

	cp := filepath.Join(libs, "*")
	logProp := "-Dlog4j2.configurationFile=" + log4j
	clusterID := randomToken(16) // a Kafka Uuid: 16 bytes in URL-safe base64
	for strings.HasPrefix(clusterID, "-") {
		clusterID = randomToken(16) // kafka-storage would read it as an option
	}
	format := append(append([]string{logProp}, jvm...), "-cp", cp, "kafka.tools.StorageTool", "format", "-t", clusterID, "-c", serverProps)
	runTool(tb, dir, "java", append(format, formatArgs...)...)

	out, err := os.Create(filepath.Join(dir, "kafka.out"))
	if err != nil {
		tb.Fatal(err)
	}
	args := append([]string{"-Xms256m", "-Xmx512m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true",
		logProp, "-Dkafka.logs.dir=" + dir}, jvm...)
	cmd := exec.Command("java", append(args, "-cp", cp, "kafka.Kafka", serverProps)...)
	cmd.Stdout, cmd.Stderr = out, out
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		out.Close()
		tb.Fatalf("testenv: start kafka: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		out.Close()
		close(exited)
	}()
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	return exited
}

// brokerAlive fails the test with the broker's last errors when the broker
// startBroker started in dir has exited.
func brokerAlive(tb testing.TB, dir string, exited <-chan struct{}) {
	tb.Helper()
	select {
	case <-exited:
		tb.Fatalf("testenv: kafka in %s exited at start: %s", dir, tail(filepath.Join(dir, "kafka.out"), filepath.Join(dir, "server.log")))
	default:
	}
}

// oneNodeProps returns the server.properties of a combined broker and
// controller keeping its data in dir, with a PLAINTEXT listener on port
// plain (also between broker and controller), a client listener of protocol
// (SASL_SSL, SASL_PLAINTEXT) on addr and the controller on port ctrl; the
// caller adds the client listener's security settings.
func oneNodeProps(dir string, plain, ctrl int, protocol, addr string) map[string]string {
	return map[string]string{
		"process.roles":                            "broker,controller",
		"node.id":                                  "1",
		"controller.quorum.voters":                 fmt.Sprintf("1@127.0.0.1:%d", ctrl),
		"listeners":                                fmt.Sprintf("PLAINTEXT://127.0.0.1:%d,%s://%s,CONTROLLER://127.0.0.1:%d", plain, protocol, addr, ctrl),
		"advertised.listeners":                     fmt.Sprintf("PLAINTEXT://127.0.0.1:%d,%s://%s", plain, protocol, addr),
		"controller.listener.names":                "CONTROLLER",
		"listener.security.protocol.map":           fmt.Sprintf("PLAINTEXT:PLAINTEXT,%s:%s,CONTROLLER:PLAINTEXT", protocol, protocol),
		"inter.broker.listener.name":               "PLAINTEXT",
		"log.dirs":                                 filepath.Join(dir, "data"),
		"num.partitions":                           "1",
		"offsets.topic.replication.factor":         "1",
		"offsets.topic.num.partitions":             "1",
		"transaction.state.log.replication.factor": "1",
		"transaction.state.log.min.isr":            "1",
		"group.initial.rebalance.delay.ms":         "0",
		"auto.create.topics.enable":                "false",
	}
}
