package main

import (
	"fmt"
	"strings"

	"github.com/IBM/sarama"
	"github.com/spf13/pflag"

	"github.com/idemhq/idem/kafkaauth"
)

// The OAUTHBEARER secrets have no flags, so they never show in a process
// list or a shell history.
const (
	// oauthSecretEnv holds the client secret of --sasl-oauth-token-url's
	// client-credentials grant.
	oauthSecretEnv = "IDEM_SASL_OAUTH_CLIENT_SECRET"
	// oauthTokenEnv holds one fixed token, used when neither
	// --sasl-oauth-token-url nor --sasl-oauth-token-file is given.
	oauthTokenEnv = "IDEM_SASL_OAUTH_TOKEN"
)

// oauthFlags adds the SASL/OAUTHBEARER flags of kafkaFlags to f, bound to
// a.auth (kafkaauth.Options.OAuth, TokenFile, Extensions).
func (a *app) oauthFlags(f *pflag.FlagSet) {
	o := &a.auth
	f.StringVar(&o.OAuth.TokenURL, "sasl-oauth-token-url", "", "OAUTHBEARER: the identity provider's token endpoint (client-credentials grant; the client secret is read from "+oauthSecretEnv+")")
	envFlag(f, "sasl-oauth-token-url", "IDEM_SASL_OAUTH_TOKEN_URL")
	f.StringVar(&o.OAuth.ClientID, "sasl-oauth-client-id", "", "OAUTHBEARER: the client id of --sasl-oauth-token-url")
	envFlag(f, "sasl-oauth-client-id", "IDEM_SASL_OAUTH_CLIENT_ID")
	f.StringSliceVar(&o.OAuth.Scopes, "sasl-oauth-scope", nil, "OAUTHBEARER: a scope to ask for (repeatable, or comma-separated)")
	envFlag(f, "sasl-oauth-scope", "IDEM_SASL_OAUTH_SCOPE")
	f.StringVar(&o.OAuth.Audience, "sasl-oauth-audience", "", "OAUTHBEARER: the audience parameter some providers need (Auth0, Okta)")
	envFlag(f, "sasl-oauth-audience", "IDEM_SASL_OAUTH_AUDIENCE")
	f.StringVar(&o.TokenFile, "sasl-oauth-token-file", "", "OAUTHBEARER: a file holding the token, read at every authentication (else "+oauthTokenEnv+")")
	envFlag(f, "sasl-oauth-token-file", "IDEM_SASL_OAUTH_TOKEN_FILE")
	f.StringToStringVar(&o.Extensions, "sasl-oauth-extension", nil, "OAUTHBEARER: a SASL extension KEY=VALUE sent with the token, e.g. Confluent Cloud's logicalCluster=lkc-… (repeatable)")
	envFlag(f, "sasl-oauth-extension", "IDEM_SASL_OAUTH_EXTENSIONS")
}

// oauthSecrets completes auth, whose Mechanism is OAUTHBEARER, with the
// secrets of the environment: the client secret when a token URL is given,
// else the fixed token when no token file is.
func (a *app) oauthSecrets(auth *kafkaauth.Options) error {
	switch {
	case auth.OAuth.TokenURL != "":
		if auth.OAuth.ClientSecret = a.env(oauthSecretEnv); auth.OAuth.ClientSecret == "" {
			return fmt.Errorf("--sasl-oauth-token-url needs a client secret: set %s", oauthSecretEnv)
		}
	case auth.TokenFile == "":
		if auth.Token = a.env(oauthTokenEnv); auth.Token == "" {
			return fmt.Errorf("--sasl-mechanism %s needs a token: give --sasl-oauth-token-url and --sasl-oauth-client-id (secret in %s), --sasl-oauth-token-file, or set %s",
				sarama.SASLTypeOAuth, oauthSecretEnv, oauthTokenEnv)
		}
	}
	return nil
}

// isOAuthBearer reports whether mechanism names SASL/OAUTHBEARER.
func isOAuthBearer(mechanism string) bool {
	return strings.EqualFold(strings.TrimSpace(mechanism), sarama.SASLTypeOAuth)
}
