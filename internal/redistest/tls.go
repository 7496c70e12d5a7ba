package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TLSServer is a redis-server that accepts only TLS connections (its plain
// port is off), with a server certificate for 127.0.0.1 signed by a
// throwaway CA generated for it. Clients are not asked for certificates.
//
// Server.Do and Server.Info speak plain TCP, so TLSServer does not offer
// them; connect with a TLS client trusting CAFile or ClientTLS.
type TLSServer struct {
	// Addr is host:port of the TLS port, for example "127.0.0.1:41234".
	Addr string
	// Port is the TLS port.
	Port int
	// CAFile is the path of the CA certificate (PEM) that signed the
	// server's certificate; it lives as long as the server.
	CAFile string
	// CAs holds that CA certificate.
	CAs *x509.CertPool

	srv *Server
}

// NewTLSStandalone starts a TLS-only standalone server for this test alone;
// t.Cleanup stops it. extra are further redis-server arguments.
func NewTLSStandalone(t testing.TB, extra ...string) *TLSServer {
	t.Helper()
	s, err := startTLSServer(extra)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(s.srv.stop)
	return s
}

// URL returns the server's rediss:// URL. A client must be told to trust
// CAFile; the system roots do not.
func (s *TLSServer) URL() string { return "rediss://" + s.Addr }

// ClientTLS returns a client configuration that trusts the server's CA.
func (s *TLSServer) ClientTLS() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: s.CAs, ServerName: "127.0.0.1"}
}

// Kill stops the server at once with SIGKILL and waits for it to exit.
func (s *TLSServer) Kill() { s.srv.Kill() }

func startTLSServer(extra []string) (*TLSServer, error) {
	var (
		files certFiles
		pool  *x509.CertPool
		ts    *TLSServer
	)
	prepare := func(dir string) (err error) {
		files, pool, err = writeCerts(dir)
		return err
	}
	err := withFreePort("redistest-tls-", prepare, func(dir string, port int) error {
		srv := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, dir: dir}
		srv.args = append(append([]string{
			"--port", "0",
			"--tls-port", strconv.Itoa(port),
			"--tls-cert-file", files.cert,
			"--tls-key-file", files.key,
			"--tls-ca-cert-file", files.ca,
			"--tls-auth-clients", "no",
		}, baseArgs(dir)...), extra...)
		if err := srv.start(); err != nil {
			return err
		}
		ts = &TLSServer{Addr: srv.Addr, Port: port, CAFile: files.ca, CAs: pool, srv: srv}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return ts, nil
}

type certFiles struct{ ca, cert, key string }

// writeCerts generates an ECDSA P-256 CA and a server certificate for
// 127.0.0.1 and localhost, valid for a day, and writes them as PEM files
// into dir.
func writeCerts(dir string) (certFiles, *x509.CertPool, error) {
	var f certFiles
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return f, nil, fmt.Errorf("ca key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "redistest throwaway CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return f, nil, fmt.Errorf("ca certificate: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return f, nil, fmt.Errorf("ca certificate: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return f, nil, fmt.Errorf("server key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return f, nil, fmt.Errorf("server certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return f, nil, fmt.Errorf("server key: %w", err)
	}
	f = certFiles{ca: filepath.Join(dir, "ca.pem"), cert: filepath.Join(dir, "server.pem"), key: filepath.Join(dir, "server.key")}
	for _, w := range []struct {
		path, typ string
		der       []byte
	}{{f.ca, "CERTIFICATE", caDER}, {f.cert, "CERTIFICATE", der}, {f.key, "PRIVATE KEY", keyDER}} {
		if err := os.WriteFile(w.path, pem.EncodeToMemory(&pem.Block{Type: w.typ, Bytes: w.der}), 0o600); err != nil {
			return f, nil, fmt.Errorf("write %s: %w", filepath.Base(w.path), err)
		}
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return f, pool, nil
}
