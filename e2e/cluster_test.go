// Package e2e runs vgpu's Kubernetes-facing tests against the real
// components, built from the modules pinned in go.mod by ./build: etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler, helm, and the
// kubelet's device manager (cmd/devicemanager). Real processes on loopback
// sockets; the Rust binaries come from cargo (target/debug).
//
// Environment: VGPU_E2E_BIN (the directory ./build prints; required),
// VGPU_TARGET (cargo's target/debug, default ../target/debug).
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// The control plane every test shares (started once in TestMain).
var cp *controlPlane

func TestMain(m *testing.M) {
	var err error
	t0 := time.Now()
	cp, err = startControlPlane()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: control plane:", err)
		if cp != nil {
			cp.stop()
		}
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "e2e: control plane (etcd, kube-apiserver, kube-controller-manager) up in %.1f s\n", time.Since(t0).Seconds())
	code := m.Run()
	cp.stop()
	os.Exit(code)
}

// peer is a built upstream binary.
func peer(name string) string {
	dir := os.Getenv("VGPU_E2E_BIN")
	if dir == "" {
		panic("VGPU_E2E_BIN is not set: run e2e/build and pass the directory it prints")
	}
	return filepath.Join(dir, name)
}

// cargoBin is a binary cargo built.
func cargoBin(name string) string {
	dir := os.Getenv("VGPU_TARGET")
	if dir == "" {
		dir = "../target/debug"
	}
	p, err := filepath.Abs(filepath.Join(dir, name))
	if err != nil {
		panic(err)
	}
	return p
}

func repoPath(rel string) string {
	p, err := filepath.Abs(filepath.Join("..", rel))
	if err != nil {
		panic(err)
	}
	return p
}

// ------------------------------------------------------------ processes

// proc is a child process whose output goes to a log file.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	mu   sync.Mutex
	err  error
}

func startProc(dir, name string, argv []string, env []string) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	// Its own process group: stop() takes its children too (unshare, sh).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		f.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) stop() {
	if p == nil || p.exited() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

func (p *proc) output() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// tail is the end of the log, for failure messages.
func (p *proc) tail() string {
	s := p.output()
	if len(s) > 4000 {
		s = "…" + s[len(s)-4000:]
	}
	return fmt.Sprintf("--- %s log (%s) ---\n%s", p.name, p.log, s)
}

// waitLine waits for a log line containing marker and returns the rest of
// that line after it.
func (p *proc) waitLine(marker string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		sc := bufio.NewScanner(strings.NewReader(p.output()))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if _, rest, ok := strings.Cut(sc.Text(), marker); ok {
				return strings.TrimSpace(rest), nil
			}
		}
		if p.exited() {
			return "", fmt.Errorf("%s exited before %q\n%s", p.name, marker, p.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return "", fmt.Errorf("%s: no %q within %s\n%s", p.name, marker, timeout, p.tail())
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// stopWaiting wraps an error that no amount of waiting fixes (a process
// exited): waitFor returns it at once.
type stopWaiting struct{ error }

func waitFor(timeout time.Duration, what string, f func() error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if last = f(); last == nil {
			return nil
		}
		if errors.As(last, new(stopWaiting)) {
			return fmt.Errorf("waiting for %s: %v", what, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("timed out after %s waiting for %s: %v", timeout, what, last)
}

// ---------------------------------------------------------------- certs

type keyPair struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
	keyPEM  []byte
}

func newCert(tmpl *x509.Certificate, parent *keyPair) (*keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl.SerialNumber = serial
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		return nil, err
	}
	cert, _ := x509.ParseCertificate(der)
	kb, _ := x509.MarshalECPrivateKey(key)
	return &keyPair{
		cert: cert, key: key,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}),
	}, nil
}

// -------------------------------------------------------- control plane

type controlPlane struct {
	dir        string
	url        string
	caPEM      []byte
	admin      *rest.Config
	adminKC    string // admin kubeconfig path
	cs         kubernetes.Interface
	dyn        dynamic.Interface
	auditLog   string
	procs      []*proc
	etcd, apis *proc
}

const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
# Every write to a Node (the quiet-API test counts the node agent's).
- level: Metadata
  resources: [{group: "", resources: ["nodes", "nodes/status"]}]
  verbs: ["create", "update", "patch", "delete"]
- level: None
`

func startControlPlane() (*controlPlane, error) {
	dir, err := os.MkdirTemp("", "vgpu-e2e-")
	if err != nil {
		return nil, err
	}
	c := &controlPlane{dir: dir}
	w := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			panic(err)
		}
		return p
	}
	ca, err := newCert(&x509.Certificate{
		Subject: pkix.Name{CommonName: "vgpu-e2e-ca"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}, nil)
	if err != nil {
		return nil, err
	}
	serving, err := newCert(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, ca)
	if err != nil {
		return nil, err
	}
	admin, err := newCert(&x509.Certificate{
		Subject:  pkix.Name{CommonName: "e2e-admin", Organization: []string{"system:masters"}},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca)
	if err != nil {
		return nil, err
	}
	sa, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	saPriv, _ := x509.MarshalECPrivateKey(sa)
	saPub, _ := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	c.caPEM = ca.certPEM
	caFile := w("ca.crt", ca.certPEM)
	srvCrt, srvKey := w("apiserver.crt", serving.certPEM), w("apiserver.key", serving.keyPEM)
	saKey := w("sa.key", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: saPriv}))
	saPubFile := w("sa.pub", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub}))
	policy := w("audit-policy.yaml", []byte(auditPolicy))
	c.auditLog = filepath.Join(dir, "audit.log")

	etcdClient, etcdPeer := freePort(), freePort()
	c.etcd, err = startProc(dir, "etcd", []string{
		peer("etcd"), "--name=e2e", "--data-dir=" + filepath.Join(dir, "etcd"),
		fmt.Sprintf("--listen-client-urls=http://127.0.0.1:%d", etcdClient),
		fmt.Sprintf("--advertise-client-urls=http://127.0.0.1:%d", etcdClient),
		fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", etcdPeer),
		fmt.Sprintf("--initial-advertise-peer-urls=http://127.0.0.1:%d", etcdPeer),
		fmt.Sprintf("--initial-cluster=e2e=http://127.0.0.1:%d", etcdPeer),
		"--unsafe-no-fsync", "--log-level=warn",
	}, nil)
	if err != nil {
		return c, err
	}
	c.procs = append(c.procs, c.etcd)

	port := freePort()
	c.url = fmt.Sprintf("https://127.0.0.1:%d", port)
	c.apis, err = startProc(dir, "kube-apiserver", []string{
		peer("kube-apiserver"),
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", etcdClient),
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", port),
		"--tls-cert-file=" + srvCrt, "--tls-private-key-file=" + srvKey,
		"--client-ca-file=" + caFile,
		"--service-cluster-ip-range=10.96.0.0/16",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + saPubFile,
		"--service-account-signing-key-file=" + saKey,
		"--authorization-mode=RBAC",
		// As kubeadm and every managed cluster: the node agent is privileged.
		"--allow-privileged=true",
		// The kubernetes Service's endpoints may not be loopback.
		"--endpoint-reconciler-type=none",
		"--audit-policy-file=" + policy, "--audit-log-path=" + c.auditLog,
		"--audit-log-mode=blocking",
	}, nil)
	if err != nil {
		return c, err
	}
	c.procs = append(c.procs, c.apis)

	c.admin = &rest.Config{
		Host:            c.url,
		TLSClientConfig: rest.TLSClientConfig{CAData: ca.certPEM, CertData: admin.certPEM, KeyData: admin.keyPEM},
		QPS:             200, Burst: 400,
	}
	c.cs = kubernetes.NewForConfigOrDie(c.admin)
	c.dyn = dynamic.NewForConfigOrDie(c.admin)
	if err := waitFor(90*time.Second, "kube-apiserver /readyz", func() error {
		if c.apis.exited() {
			return stopWaiting{fmt.Errorf("exited\n%s", c.apis.tail())}
		}
		b, err := c.cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(context.Background())
		if err != nil {
			return fmt.Errorf("%v: %s", err, b)
		}
		return nil
	}); err != nil {
		return c, err
	}
	c.adminKC = filepath.Join(dir, "admin.kubeconfig")
	if err := writeKubeconfig(c.adminKC, c.url, ca.certPEM, &clientcmdapi.AuthInfo{
		ClientCertificateData: admin.certPEM, ClientKeyData: admin.keyPEM,
	}); err != nil {
		return c, err
	}
	// The controllers the tests lean on: default ServiceAccounts (the
	// ServiceAccount admission plugin needs them), namespace deletion and
	// garbage collection; the resourceclaim controller (a pod's claims from
	// its ResourceClaimTemplates, their reservations and deletion). No
	// node lifecycle: no kubelet heartbeats here.
	kcm, err := startProc(dir, "kube-controller-manager", []string{
		peer("kube-controller-manager"), "--kubeconfig=" + c.adminKC,
		"--controllers=serviceaccount-controller,namespace-controller,garbage-collector-controller,resourceclaim-controller",
		"--leader-elect=false", "--secure-port=0",
	}, nil)
	if err != nil {
		return c, err
	}
	c.procs = append(c.procs, kcm)
	for _, ns := range []string{"default", "kube-system"} {
		if err := waitFor(60*time.Second, "ServiceAccount "+ns+"/default", func() error {
			if kcm.exited() {
				return stopWaiting{fmt.Errorf("kube-controller-manager exited\n%s", kcm.tail())}
			}
			_, err := c.cs.CoreV1().ServiceAccounts(ns).Get(context.Background(), "default", metav1.GetOptions{})
			return err
		}); err != nil {
			return c, err
		}
	}
	return c, nil
}

func (c *controlPlane) stop() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].stop()
	}
	if os.Getenv("VGPU_E2E_KEEP") == "" {
		os.RemoveAll(c.dir)
	} else {
		fmt.Fprintln(os.Stderr, "e2e: kept", c.dir)
	}
}

func writeKubeconfig(path, server string, ca []byte, auth *clientcmdapi.AuthInfo) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos["e2e"] = auth
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "e2e"}
	cfg.CurrentContext = "e2e"
	return clientcmd.WriteToFile(*cfg, path)
}

// saKubeconfig writes a kubeconfig that authenticates as a ServiceAccount
// with a real token from the TokenRequest API: what a pod running as it
// gets, so the chart's RBAC is what allows or refuses its calls.
func (c *controlPlane) saKubeconfig(t *testing.T, ns, name string) string {
	t.Helper()
	exp := int64(3600)
	tr, err := c.cs.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), name,
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s/%s: %v", ns, name, err)
	}
	p := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := writeKubeconfig(p, c.url, c.caPEM, &clientcmdapi.AuthInfo{Token: tr.Status.Token}); err != nil {
		t.Fatal(err)
	}
	return p
}

// auditWrites counts the audit log's Node writes by user (ResponseComplete).
func (c *controlPlane) auditWrites(user string) (int, []string) {
	b, _ := os.ReadFile(c.auditLog)
	n, lines := 0, []string(nil)
	for _, l := range bytes.Split(b, []byte("\n")) {
		if bytes.Contains(l, []byte(`"stage":"ResponseComplete"`)) &&
			bytes.Contains(l, []byte(`"username":"`+user+`"`)) {
			n++
			lines = append(lines, string(l))
		}
	}
	return n, lines
}

// forceDeletePods deletes pods at once (no kubelet finishes them here).
func (c *controlPlane) forceDeletePods(t *testing.T, ns string, names ...string) {
	t.Helper()
	zero := int64(0)
	for _, n := range names {
		err := c.cs.CoreV1().Pods(ns).Delete(context.Background(), n, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		if err != nil && !strings.Contains(err.Error(), "not found") {
			t.Errorf("delete pod %s/%s: %v", ns, n, err)
		}
	}
}

func ensureNamespace(t *testing.T, name string) {
	t.Helper()
	_, err := cp.cs.CoreV1().Namespaces().Create(context.Background(),
		&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	if err := waitFor(30*time.Second, "ServiceAccount "+name+"/default", func() error {
		_, err := cp.cs.CoreV1().ServiceAccounts(name).Get(context.Background(), "default", metav1.GetOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// run runs a command to completion, its combined output returned.
func run(name string, args ...string) (string, error) {
	var out bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}
