// Package awsmsk supplies the SASL/OAUTHBEARER tokens of Amazon MSK's IAM
// access control to kafkaauth, so an idem consumer, relay or CLI built on
// sarama reaches an MSK cluster's IAM listener (port 9098) with the
// service's AWS identity instead of a user and password.
//
// It is a module of its own (github.com/idemhq/idem/kafkaauth/awsmsk) so that
// idem itself does not depend on the AWS SDK. The tokens come from AWS's
// signer, github.com/aws/aws-msk-iam-sasl-signer-go: a SigV4 presigned URL
// for the action kafka-cluster:Connect on kafka.<region>.amazonaws.com,
// valid 15 minutes, base64url-encoded. Config.Fetch signs one; given as
// kafkaauth.Options.FetchToken, a new token is signed once 80 % of the last
// one's lifetime has passed, so the broker's re-authentication always gets
// a fresh one:
//
//	msk := awsmsk.Config{Region: "eu-west-1"}
//	if err := msk.Validate(); err != nil { … }
//	err := kafkaauth.Apply(kcfg, kafkaauth.Options{TLS: true, Mechanism: "OAUTHBEARER", FetchToken: msk.Fetch})
//
// The credentials are the AWS SDK's default chain (environment, shared
// files, EKS IRSA or Pod Identity, ECS, EC2) unless Config names a profile,
// a role to assume or a credentials provider. The IAM policy of that
// identity must allow kafka-cluster:Connect on the cluster, and the
// kafka-cluster actions of the topics and groups the service uses.
package awsmsk

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-msk-iam-sasl-signer-go/signer"
	"github.com/aws/aws-sdk-go-v2/aws"
)

// Config says which cluster region the tokens are for and where the IAM
// credentials come from. At most one of Profile, RoleARN and Credentials
// may be set; none means the AWS SDK's default credential chain.
type Config struct {
	// Region is the AWS region of the MSK cluster, e.g. "eu-west-1".
	// Required.
	Region string
	// Profile is a named profile of the shared AWS config and credentials
	// files. Default: "" (the default chain).
	Profile string
	// RoleARN is a role to assume with STS (from the default chain's
	// credentials) before signing. Default: "".
	RoleARN string
	// SessionName is the STS session name of RoleARN. Default: the signer's,
	// "MSKSASLDefaultSession".
	SessionName string
	// Credentials supplies the credentials directly, e.g.
	// credentials.NewStaticCredentialsProvider of the AWS SDK in a test, or
	// a provider the service already has. Default: nil.
	Credentials aws.CredentialsProvider
}

// Validate reports a Config that cannot sign: no region, or more than one
// credential source.
func (c Config) Validate() error {
	if c.Region == "" {
		return errors.New("awsmsk: Config.Region is empty: the region of the MSK cluster is required")
	}
	n := 0
	for _, set := range []bool{c.Profile != "", c.RoleARN != "", c.Credentials != nil} {
		if set {
			n++
		}
	}
	if n > 1 {
		return errors.New("awsmsk: set at most one of Config.Profile, Config.RoleARN and Config.Credentials")
	}
	if c.SessionName != "" && c.RoleARN == "" {
		return errors.New("awsmsk: Config.SessionName is set but Config.RoleARN is not")
	}
	return nil
}

// Fetch signs a new token with the credentials c names and returns it with
// the time it expires (15 minutes after signing): give it as
// kafkaauth.Options.FetchToken, with Mechanism "OAUTHBEARER" and TLS (MSK's
// IAM listener takes TLS only). ctx bounds the signing, which may call STS
// or the instance metadata service for credentials. It fails when c does
// not Validate.
func (c Config) Fetch(ctx context.Context) (string, time.Time, error) {
	if err := c.Validate(); err != nil {
		return "", time.Time{}, err
	}
	var (
		tok string
		ms  int64
		err error
	)
	switch {
	case c.Credentials != nil:
		tok, ms, err = signer.GenerateAuthTokenFromCredentialsProvider(ctx, c.Region, c.Credentials)
	case c.Profile != "":
		tok, ms, err = signer.GenerateAuthTokenFromProfile(ctx, c.Region, c.Profile)
	case c.RoleARN != "":
		tok, ms, err = signer.GenerateAuthTokenFromRole(ctx, c.Region, c.RoleARN, c.SessionName)
	default:
		tok, ms, err = signer.GenerateAuthToken(ctx, c.Region)
	}
	if err != nil {
		return "", time.Time{}, fmt.Errorf("awsmsk: sign a token for %s: %w", c.Region, err)
	}
	return tok, time.UnixMilli(ms), nil
}
