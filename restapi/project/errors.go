package projectapi

import (
	"net/http"

	"github.com/han-app/gateway/restapi/apierr"
)

// The codes of the project Redis API (docs/project-redis-api.md). The
// handlers return the request-level ones; restapi's error table maps the
// sentinels of store/project to the exported ones.
var (
	ErrProjectNotFound      = apierr.New(http.StatusNotFound, "project_not_found")
	ErrUnsafeEviction       = apierr.New(http.StatusServiceUnavailable, "unsafe_eviction_policy")
	ErrDataStateInvalid     = apierr.New(http.StatusServiceUnavailable, "data_state_invalid")
	ErrCacheKeyExists       = apierr.New(http.StatusConflict, "cache_key_exists")
	ErrCacheKeyNotFound     = apierr.New(http.StatusNotFound, "cache_key_not_found")
	ErrTopicNotFound        = apierr.New(http.StatusNotFound, "topic_not_found")
	ErrSubscriptionNotFound = apierr.New(http.StatusNotFound, "subscription_not_found")
	ErrMessageNotFound      = apierr.New(http.StatusNotFound, "message_not_found")
	ErrTopicNameTaken       = apierr.New(http.StatusConflict, "topic_name_taken")
	ErrPublishConflict      = apierr.New(http.StatusConflict, "publish_conflict")
	ErrSubscriptionPaused   = apierr.New(http.StatusConflict, "subscription_paused")
	ErrDeliveryPaused       = apierr.New(http.StatusConflict, "delivery_paused")
	ErrLeaseExpired         = apierr.New(http.StatusConflict, "lease_expired")
	ErrLeaseTokenMismatch   = apierr.New(http.StatusConflict, "lease_token_mismatch")
	ErrReceiptConflict      = apierr.New(http.StatusConflict, "receipt_conflict")
	ErrBudgetExhausted      = apierr.New(http.StatusConflict, "budget_exhausted")
)

var (
	errInvalidSettings      = apierr.New(http.StatusBadRequest, "invalid_settings")
	errCacheQuotaExceeded   = apierr.New(http.StatusConflict, "cache_quota_exceeded")
	errInvalidCacheKey      = apierr.New(http.StatusBadRequest, "invalid_cache_key")
	errInvalidCacheType     = apierr.New(http.StatusBadRequest, "invalid_cache_type")
	errInvalidCacheValue    = apierr.New(http.StatusBadRequest, "invalid_cache_value")
	errInvalidCacheTTL      = apierr.New(http.StatusBadRequest, "invalid_cache_ttl")
	errCacheNoExpiry        = apierr.New(http.StatusBadRequest, "cache_no_expiry_unsupported")
	errInvalidTopicName     = apierr.New(http.StatusBadRequest, "invalid_topic_name")
	errInvalidPayload       = apierr.New(http.StatusBadRequest, "invalid_payload")
	errMessageTooLarge      = apierr.New(http.StatusBadRequest, "message_too_large")
	errInvalidCount         = apierr.New(http.StatusBadRequest, "invalid_count")
	errInvalidReceiptStatus = apierr.New(http.StatusBadRequest, "invalid_receipt_status")
	errResultTooLarge       = apierr.New(http.StatusBadRequest, "result_too_large")
	errInvalidSubStatus     = apierr.New(http.StatusBadRequest, "invalid_subscription_status")
)
