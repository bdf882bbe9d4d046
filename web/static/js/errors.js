// Stable error codes of the API (docs/errors.md) and the sentence
// a person reads next to the code.
import { h } from "./dom.js";

const sentences = {
  // transport (client-side codes)
  network_error: "The server could not be reached. Check the connection; the request can be retried safely.",
  invalid_response: "The server answered something this client does not understand.",
  // auth
  unauthorized: "The token is missing, expired or not valid here. Sign in again with a fresh token.",
  user_session_required: "This needs a user token; service tokens are not accepted here.",
  token_user_mismatch: "That token belongs to another user. Paste a token of the signed-in user.",
  forbidden: "Your role in this project does not allow this.",
  // generic
  invalid_json: "The request body is not valid JSON (or a field has the wrong type).",
  payload_too_large: "The request is larger than the server accepts.",
  unsupported_media_type: "This content type is not accepted.",
  not_found: "There is nothing at this address.",
  method_not_allowed: "This action is not available here.",
  rate_limited: "Too many requests. The client waits and tries again.",
  database_unavailable: "The database is unavailable right now. Try again in a moment.",
  database_busy: "The database is busy right now. The request was not done; try again in a moment.",
  overloaded: "The server has too many open connections right now. Try again in a moment.",
  request_timeout: "The upload stopped arriving and was cut off. Check the connection and try again.",
  invalid_body_stream: "The request was cut off while it was being sent. Try again.",
  redis_unavailable: "Redis is unavailable right now. Try again in a moment.",
  redis_oom: "Redis is out of memory, so writes are refused. Reads still work.",
  redis_expiry_denied: "Redis refused to set an expiry, so nothing was written.",
  data_state_invalid: "The project's stored data is inconsistent; an operator has to repair it. Nothing was written.",
  unsafe_eviction_policy: "Redis runs an eviction policy that could drop reliable data, so writes are refused.",
  internal: "The server failed unexpectedly.",
  // chat
  invalid_body: "A message needs 1 to 4000 characters and cannot be blank.",
  dialog_busy: "This dialog is receiving too many messages at once. The message was not sent; try again in a moment.",
  invalid_uuid: "That id is not a valid UUID.",
  invalid_members: "Members must be other users' ids (UUIDs), at most 99 besides you.",
  invalid_title: "The title is too long or contains control or invisible characters.",
  invalid_client_message_id: "The client message id is not valid.",
  invalid_limit: "The page size is out of range.",
  invalid_cursor: "The page cursor is not valid; start from the first page.",
  dialog_not_found: "This dialog does not exist or you are not a member.",
  user_not_found: "No such user (they must sign in once before they can be added).",
  idempotency_key_required: "The request needs an Idempotency-Key.",
  invalid_idempotency_key: "The Idempotency-Key is not valid.",
  idempotency_key_reused: "This key was already used for a different request.",
  idempotency_in_progress: "The same request is still being processed; retrying shortly.",
  invalid_attachment: "An attachment is not an uploaded file of this dialog (at most 10 per message).",
  attachment_not_found: "The attachment does not exist or you cannot see it.",
  attachment_not_uploaded: "The attachment's upload has not finished.",
  attachment_already_uploaded: "The attachment was already uploaded.",
  upload_size_mismatch: "The uploaded file does not have the declared size.",
  invalid_signature: "The link is not valid.",
  url_expired: "The link has expired; ask for a new one.",
  invalid_content_type: "This kind of file cannot be attached.",
  invalid_size: "The file is empty or larger than attachments may be.",
  precondition_failed: "The file changed since it was first read; download it again.",
  range_not_satisfiable: "The requested part of the file does not exist.",
  upload_in_progress: "This file is already being uploaded; wait for that upload to finish.",
  attachments_busy: "Too many files are being transferred right now. Try again in a moment.",
  insufficient_storage: "The server has no room for this file right now.",
  blob_store_unavailable: "File storage is unavailable right now. Try again in a moment.",
  invalid_filename: "The file name is not allowed (control or invisible characters, or a path).",
  // service endpoints (the inbox for other services, the safety status of a message)
  invalid_id: "The id is not 1 to 128 letters, digits or . _ : -.",
  invalid_kind: "The kind is not 1 to 64 lower-case letters, digits or . _ -.",
  invalid_target: "Give exactly one of a dialog id or a user id, as a UUID.",
  invalid_data: "The data is not a JSON object of at most 16 KiB.",
  inbox_conflict: "An item with this id was already delivered with other content.",
  safety_task_not_found: "This message was sent while safety checks were off, so it has no check.",
  // realtime error frames
  invalid_frame: "The realtime server refused a malformed frame.",
  unknown_type: "The realtime server does not know this frame type.",
  too_many_subscriptions: "Too many dialogs are followed live on this connection.",
  not_subscribed: "Typing needs a live subscription to the dialog.",
  unavailable: "The realtime server is temporarily unavailable.",
  // project Redis API
  project_not_found: "No project with this id.",
  invalid_cache_key: "A key has 1 to 256 UTF-8 bytes and no control characters.",
  invalid_cache_type: "The type must be json or string.",
  invalid_cache_value: "The value must be a string; for type json it must be valid JSON text.",
  invalid_cache_ttl: "The TTL must be a whole number of seconds from 1 to 2592000 (30 days).",
  cache_no_expiry_unsupported: "Entries that never expire are no longer supported; give a TTL.",
  invalid_settings: "Send exactly one setting with a valid value.",
  cache_key_exists: "The key already exists (create only was ticked).",
  cache_quota_exceeded: "Key plus value is larger than this project's cache quota.",
  cache_key_not_found: "The key does not exist (it may have expired).",
  invalid_topic_name: "The topic name is not valid.",
  topic_name_taken: "A topic with this name already exists.",
  topic_not_found: "The topic does not exist in this project.",
  subscription_not_found: "The subscription does not exist in this project.",
  message_not_found: "The message does not exist in this project.",
  invalid_payload: "The payload must be a JSON object (integers within ±2^53).",
  message_too_large: "The payload is larger than 16 KiB once normalized.",
  publish_conflict: "This producer id and client event id were already used with a different payload.",
  invalid_count: "Claim between 1 and 20 messages.",
  invalid_receipt_status: "The status must be processed or failed.",
  result_too_large: "The result is longer than 256 bytes.",
  invalid_subscription_status: "The status must be online or paused.",
  subscription_paused: "The subscription is paused: resume it to claim.",
  delivery_paused: "Delivery is paused for the whole project.",
  lease_expired: "The lease has expired; claim the message again.",
  lease_token_mismatch: "This token does not hold the current lease.",
  receipt_conflict: "The receipt was already acknowledged with a different outcome.",
  budget_exhausted: "The reliable-data budget is used up; trim or delete to free space.",
};

// sentence is the sentence of a code; a code without one of its own (a
// property every object has, such as "constructor", is none) gets the
// generic sentence of its status.
export function sentence(code, status) {
  if (typeof code === "string" && Object.hasOwn(sentences, code)) return sentences[code];
  if (status >= 500) return "The server could not complete the request.";
  return "The request was refused.";
}

// errorView renders an error as its stable code plus the sentence.
export function errorView(err, id) {
  const code = (err && err.code) || "internal";
  return h("div", { class: "alert alert-error", role: "alert", id, dataset: { code } },
    h("code", { class: "code", text: code }), " ", h("span", { text: sentence(code, err && err.status) }));
}
