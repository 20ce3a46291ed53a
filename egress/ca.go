package egress

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"sync"
	"time"
)

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 7 * 24 * time.Hour
	leafRenew    = time.Hour // a cached leaf this close to expiry is minted again
	maxLeaves    = 1024      // cached leaves per CA; beyond, the cache starts over
)

// CA is a per-session certificate authority. The sandbox trusts its
// certificate; leaf certificates for intercepted hosts are minted on demand
// and cached.
type CA struct {
	cert    *x509.Certificate
	certDER []byte
	key     *ecdsa.PrivateKey

	mu      sync.Mutex
	leafKey *ecdsa.PrivateKey // one key for every leaf, made on first use
	leaves  map[string]*tls.Certificate
}

// NewCA makes a CA for session sessionID: ECDSA P-256, valid 10 years, CN
// "sandgate session <id> CA".
func NewCA(sessionID string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "sandgate session " + sessionID + " CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		SubjectKeyId:          keyID(&key.PublicKey),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	return &CA{cert: cert, certDER: der, key: key}, nil
}

// ParseCA loads a CA saved with MarshalPEM.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, errors.New("parse CA: no CERTIFICATE PEM block")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	if !cert.IsCA {
		return nil, errors.New("parse CA: certificate is not a CA")
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, errors.New("parse CA: no key PEM block")
	}
	var signer crypto.Signer
	switch kb.Type {
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse CA key: %w", err)
		}
		s, ok := k.(crypto.Signer)
		if !ok {
			return nil, errors.New("parse CA key: not a signing key")
		}
		signer = s
	case "EC PRIVATE KEY":
		k, err := x509.ParseECPrivateKey(kb.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse CA key: %w", err)
		}
		signer = k
	default:
		return nil, fmt.Errorf("parse CA key: unexpected PEM block %q", kb.Type)
	}
	key, ok := signer.(*ecdsa.PrivateKey)
	if !ok {
		return nil, errors.New("parse CA key: not an ECDSA key")
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("parse CA: key does not match certificate")
	}
	return &CA{cert: cert, certDER: cb.Bytes, key: key}, nil
}

// CertPEM is the CA certificate, for the sandbox's trust store.
func (c *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.certDER})
}

// MarshalPEM returns the certificate and the PKCS#8 private key, to persist
// the CA across gateway restarts.
func (c *CA) MarshalPEM() (certPEM, keyPEM []byte, err error) {
	der, err := x509.MarshalPKCS8PrivateKey(c.key)
	if err != nil {
		return nil, nil, fmt.Errorf("marshal CA key: %w", err)
	}
	return c.CertPEM(), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// leaf returns a certificate for host (a normalized hostname or IP
// literal), minted on first use and cached.
func (c *CA) leaf(host string) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if l, ok := c.leaves[host]; ok && now.Add(leafRenew).Before(l.Leaf.NotAfter) {
		return l, nil
	}
	if c.leafKey == nil {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("generate leaf key: %w", err)
		}
		c.leafKey = k
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(leafValidity)
	if notAfter.After(c.cert.NotAfter) {
		notAfter = c.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:   serial,
		Subject:        pkix.Name{CommonName: host},
		NotBefore:      now.Add(-time.Hour),
		NotAfter:       notAfter,
		KeyUsage:       x509.KeyUsageDigitalSignature,
		ExtKeyUsage:    []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		AuthorityKeyId: c.cert.SubjectKeyId,
	}
	if a, err := netip.ParseAddr(host); err == nil {
		tmpl.IPAddresses = append(tmpl.IPAddresses, a.AsSlice())
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &c.leafKey.PublicKey, c.key)
	if err != nil {
		return nil, fmt.Errorf("create leaf certificate for %s: %w", host, err)
	}
	parsed, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse leaf certificate for %s: %w", host, err)
	}
	l := &tls.Certificate{Certificate: [][]byte{der, c.certDER}, PrivateKey: c.leafKey, Leaf: parsed}
	if c.leaves == nil || len(c.leaves) >= maxLeaves {
		c.leaves = make(map[string]*tls.Certificate)
	}
	c.leaves[host] = l
	return l, nil
}

func randomSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("certificate serial: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil
}

func keyID(pub *ecdsa.PublicKey) []byte {
	b, err := pub.Bytes()
	if err != nil {
		return nil
	}
	sum := sha256.Sum256(b)
	return sum[:20]
}
