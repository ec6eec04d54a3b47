// Command registry is the OCI registry of the Helm OCI tests: distribution's registry with
// only the filesystem storage driver and the htpasswd and token auth linked in, plus the
// two small pieces a test needs beside it, so the tests need no other tool:
//
//	registry serve <config.yml>       the registry (distribution's own command line)
//	registry htpasswd <user>          prints "<user>:<bcrypt of the password read on stdin>"
//	registry token-server <dir>       a Bearer token issuer for the registry's `auth: token`:
//	                                  checks Basic credentials against <dir>/htpasswd, signs
//	                                  tokens with a fresh ES256 key whose public half it writes
//	                                  to <dir>/jwks.json, and writes its address (127.0.0.1:port)
//	                                  to <dir>/token-addr once it listens
package main

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/auth/htpasswd"
	"github.com/distribution/distribution/v3/registry/auth/token"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	"github.com/go-jose/go-jose/v4"
	"golang.org/x/crypto/bcrypt"
)

// Issuer, audience (the registry's `service`) and key id the test config names.
const (
	issuer  = "tender-test-issuer"
	service = "tender-test-registry"
	keyID   = "tender-test-key"
)

func main() {
	var err error
	switch {
	case len(os.Args) == 3 && os.Args[1] == "htpasswd":
		err = htpasswd(os.Args[2])
	case len(os.Args) == 3 && os.Args[1] == "token-server":
		err = tokenServer(os.Args[2])
	default:
		// No OpenTelemetry collector runs beside the tests: do not try to export traces.
		if os.Getenv("OTEL_TRACES_EXPORTER") == "" {
			_ = os.Setenv("OTEL_TRACES_EXPORTER", "none")
		}
		// nolint:errcheck // RootCmd exits non-zero itself on failure.
		registry.RootCmd.Execute()
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, os.Args[1]+":", err)
		os.Exit(1)
	}
}

func htpasswd(user string) error {
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil && line == "" {
		return fmt.Errorf("reading the password from stdin: %w", err)
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(strings.TrimRight(line, "\r\n")), bcrypt.DefaultCost)
	if err != nil {
		return err
	}
	fmt.Printf("%s:%s\n", user, hash)
	return nil
}

func tokenServer(dir string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	jwks, err := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{
		{Key: &key.PublicKey, KeyID: keyID, Algorithm: string(jose.ES256), Use: "sig"},
	}})
	if err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(dir, "jwks.json"), jwks); err != nil {
		return err
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", keyID))
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(dir, "token-addr"), []byte(ln.Addr().String())); err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/token", func(w http.ResponseWriter, r *http.Request) {
		user, pass, ok := r.BasicAuth()
		if !ok || !checkPassword(filepath.Join(dir, "htpasswd"), user, pass) {
			fmt.Fprintf(os.Stderr, "token: refused %q (credentials given: %v)\n", r.UserAgent(), ok)
			w.Header().Set("WWW-Authenticate", `Basic realm="tender-test-token"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED"}]}`, http.StatusUnauthorized)
			return
		}
		now := time.Now()
		claims := token.ClaimSet{
			Issuer: issuer, Subject: user, Audience: token.AudienceList{service},
			Expiration: now.Add(5 * time.Minute).Unix(), NotBefore: now.Add(-time.Minute).Unix(),
			IssuedAt: now.Unix(), JWTID: fmt.Sprint(now.UnixNano()),
		}
		for _, scope := range r.URL.Query()["scope"] {
			// repository:<name>:<actions>; every authenticated user gets what it asks.
			parts := strings.Split(scope, ":")
			if len(parts) < 3 {
				continue
			}
			claims.Access = append(claims.Access, &token.ResourceActions{
				Type: parts[0], Name: strings.Join(parts[1:len(parts)-1], ":"),
				Actions: strings.Split(parts[len(parts)-1], ","),
			})
		}
		payload, err := json.Marshal(claims)
		if err == nil {
			var signed *jose.JSONWebSignature
			if signed, err = signer.Sign(payload); err == nil {
				var compact string
				if compact, err = signed.CompactSerialize(); err == nil {
					fmt.Fprintf(os.Stderr, "token: issued %q to %s for %v\n", r.UserAgent(), user, r.URL.Query()["scope"])
					w.Header().Set("Content-Type", "application/json")
					_ = json.NewEncoder(w).Encode(map[string]any{"token": compact, "expires_in": 300})
					return
				}
			}
		}
		http.Error(w, err.Error(), http.StatusInternalServerError)
	})
	return http.Serve(ln, mux)
}

// checkPassword compares against the bcrypt line of user in the htpasswd file.
func checkPassword(path, user, pass string) bool {
	data, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	for _, line := range bytes.Split(data, []byte("\n")) {
		u, hash, ok := bytes.Cut(bytes.TrimSpace(line), []byte(":"))
		if ok && string(u) == user {
			return bcrypt.CompareHashAndPassword(hash, []byte(pass)) == nil
		}
	}
	return false
}

func writeAtomic(path string, data []byte) error {
	tmp := path + ".partial"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
